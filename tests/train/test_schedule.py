"""Schedules against hand-written tables: WaLDORf eq. (9)'s stages, LR and temperature shapes, all-at-once."""

from __future__ import annotations

import random

import pytest

from distillpipe.config.base import ConfigError, build
from distillpipe.config.run import AllAtOnceConfig, ScheduleConfig, SlowBuildConfig
from distillpipe.train.schedule import build_schedule


def slow(phase_steps=None, build_fraction=None, warmup_fraction=0.0, temperature=4.0) -> SlowBuildConfig:
    return SlowBuildConfig(
        kind="slow_build",
        phase_steps=phase_steps,
        build_fraction=build_fraction,
        warmup_fraction=warmup_fraction,
        temperature=temperature,
    )


def active(weights: dict[str, float]) -> set[str]:
    assert set(weights.values()) <= {0.0, 1.0}
    return {t for t, w in weights.items() if w}


OUT = {"soft", "hard", "mlm_kd", "lm"}
B0, B1, B2 = ({f"{t}/{j}" for t in ("hidden", "attn", "attn_kl")} for j in range(3))

# tau* = 10, 3 blocks, 100 steps: stages start at 0, 10, 20, 30 and the final phase at 40.
EXPECTED_ACTIVE = {
    0: {"embedding"},
    9: {"embedding"},
    10: {"embedding"} | B0,
    19: {"embedding"} | B0,
    20: {"embedding"} | B0 | B1,
    29: {"embedding"} | B0 | B1,
    30: {"embedding"} | B0 | B1 | B2,
    39: {"embedding"} | B0 | B1 | B2,
    40: {"embedding"} | B0 | B1 | B2 | OUT,
    99: {"embedding"} | B0 | B1 | B2 | OUT,
    150: {"embedding"} | B0 | B1 | B2 | OUT,  # past the end: end values
}
EXPECTED_PHASE = {
    0: "build/embedding",
    9: "build/embedding",
    10: "build/block0",
    29: "build/block1",
    30: "build/block2",
    39: "build/block2",
    40: "final",
    99: "final",
}


def test_slow_build_terms_are_added_one_block_at_a_time_and_kept():
    s = build_schedule(slow(phase_steps=10), blocks=range(3), total_steps=100)
    assert set(s.weights(0)) == {"embedding"} | B0 | B1 | B2 | OUT
    for step, expected in EXPECTED_ACTIVE.items():
        assert active(s.weights(step)) == expected, step
    for step, name in EXPECTED_PHASE.items():
        assert s.phase(step) == name, step


def test_slow_build_matches_eq_9_at_every_step():
    """chi_j(tau) = Theta(tau - (j+1) tau*), Theta(0) = 1; the output terms use chi_n."""
    tau, n, total = 7, 4, 60
    s = build_schedule(slow(phase_steps=tau), blocks=range(n), total_steps=total)
    for step in range(total):
        w = s.weights(step)
        assert w["embedding"] == 1.0
        for j in range(n):
            chi = 1.0 if step - (j + 1) * tau >= 0 else 0.0
            assert w[f"hidden/{j}"] == w[f"attn/{j}"] == chi
        assert w["soft"] == w["hard"] == (1.0 if step >= (n + 1) * tau else 0.0)


def test_slow_build_lr_constant_then_linear_to_zero():
    s = build_schedule(slow(phase_steps=10), blocks=range(3), total_steps=100)
    assert [s.lr_factor(t) for t in range(41)] == [1.0] * 41
    # (100 - step) / (100 - 40): half-way at 70, 1/60 on the last step, 0 at the end
    assert s.lr_factor(70) == pytest.approx(0.5)
    assert s.lr_factor(99) == pytest.approx(1 / 60)
    assert s.lr_factor(100) == 0.0 and s.lr_factor(1000) == 0.0
    diffs = {round(s.lr_factor(t) - s.lr_factor(t + 1), 12) for t in range(40, 100)}
    assert diffs == {round(1 / 60, 12)}


def test_slow_build_temperature_decays_from_t0_to_one_in_final_phase():
    s = build_schedule(slow(phase_steps=10, temperature=4.0), blocks=range(3), total_steps=100)
    assert all(s.temperature(t) == 4.0 for t in range(41))
    assert s.temperature(70) == pytest.approx(2.5)
    assert s.temperature(100) == pytest.approx(1.0) and s.temperature(500) == pytest.approx(1.0)
    diffs = {round(s.temperature(t) - s.temperature(t + 1), 12) for t in range(40, 100)}
    assert diffs == {round(3 / 60, 12)}


def test_slow_build_warmup():
    s = build_schedule(slow(phase_steps=10, warmup_fraction=0.05), blocks=range(3), total_steps=100)
    assert [s.lr_factor(t) for t in range(7)] == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.0])
    assert s.lr_factor(70) == pytest.approx(0.5)


def test_build_fraction_sizes_the_stages():
    by_steps = build_schedule(slow(phase_steps=10), blocks=range(3), total_steps=100)
    by_fraction = build_schedule(slow(build_fraction=0.4), blocks=range(3), total_steps=100)
    assert by_fraction.tau == 10 and by_fraction.final_start == 40
    for t in range(0, 101, 3):
        assert by_fraction.weights(t) == by_steps.weights(t)
        assert by_fraction.lr_factor(t) == by_steps.lr_factor(t)
        assert by_fraction.temperature(t) == by_steps.temperature(t)
    # floor: 0.5 * 101 / 4 = 12.6 -> 12 steps per stage
    assert build_schedule(slow(build_fraction=0.5), blocks=range(3), total_steps=101).tau == 12


def test_slow_build_rejects_a_run_without_final_phase():
    with pytest.raises(ConfigError, match="no final phase"):
        build_schedule(slow(phase_steps=25), blocks=range(3), total_steps=100)
    with pytest.raises(ConfigError, match="less than one step"):
        build_schedule(slow(build_fraction=0.1), blocks=range(8), total_steps=20)
    with pytest.raises(ConfigError, match="warm-up"):
        build_schedule(slow(phase_steps=2, warmup_fraction=0.5), blocks=range(3), total_steps=100)


def test_slow_build_unknown_term_raises():
    w = build_schedule(slow(phase_steps=10), blocks=range(3), total_steps=100).weights(50)
    with pytest.raises(KeyError, match="hidden/3"):
        w["hidden/3"]


def test_all_at_once():
    cfg = AllAtOnceConfig(kind="all_at_once", warmup_fraction=0.1, temperature=3.0, temperature_decay=False)
    s = build_schedule(cfg, blocks=range(2), total_steps=100)
    for t in (0, 5, 99):
        w = s.weights(t)
        assert set(w.values()) == {1.0} and {"embedding", "hidden/1", "attn/1", "soft", "hard", "mlm_kd"} <= set(w)
        assert w["mlm"] == w["anything/7"] == 1.0
    expected_lr = {0: 0.0, 5: 0.5, 10: 1.0, 55: 0.5, 100: 0.0}  # warm-up to step 10, then (100 - t) / 90
    assert {t: s.lr_factor(t) for t in expected_lr} == pytest.approx(expected_lr)
    assert {s.temperature(t) for t in range(0, 101, 10)} == {3.0}
    assert s.phase(9) == "warmup" and s.phase(10) == "decay"
    decaying = build_schedule(
        AllAtOnceConfig(kind="all_at_once", warmup_fraction=0.0, temperature=3.0, temperature_decay=True),
        blocks=range(2),
        total_steps=100,
    )
    assert decaying.lr_factor(0) == 1.0 and decaying.lr_factor(25) == pytest.approx(0.75)
    assert [decaying.temperature(t) for t in (0, 50, 100)] == pytest.approx([3.0, 2.0, 1.0])


@pytest.mark.parametrize(
    "cfg",
    [
        slow(phase_steps=6),
        slow(build_fraction=0.5, warmup_fraction=0.1),
        AllAtOnceConfig(kind="all_at_once", warmup_fraction=0.2, temperature=2.0, temperature_decay=True),
    ],
)
def test_pure_function_of_step(cfg):
    """Values depend on the step only: any query order, and a schedule rebuilt on resume, agree."""

    def table(s, steps):
        return {t: (dict(s.weights(t)), s.temperature(t), s.lr_factor(t), s.phase(t)) for t in steps}

    steps = list(range(80))
    first = table(build_schedule(cfg, blocks=range(3), total_steps=80), steps)
    shuffled = steps[:]
    random.Random(0).shuffle(shuffled)
    again = build_schedule(cfg, blocks=range(3), total_steps=80)
    assert table(again, shuffled) == first
    with pytest.raises(ValueError):
        again.lr_factor(-1)


def test_schedule_config_loader_and_checks():
    raw = {"kind": "slow_build", "phase_steps": None, "build_fraction": 0.5, "warmup_fraction": 0.0, "temperature": 2}
    assert build(ScheduleConfig, raw, "schedule") == slow(build_fraction=0.5, temperature=2.0)
    raw_all = {"kind": "all_at_once", "warmup_fraction": 0.1, "temperature": 1.0, "temperature_decay": False}
    assert isinstance(build(ScheduleConfig, raw_all, "schedule"), AllAtOnceConfig)
    with pytest.raises(ConfigError, match="exactly one"):
        slow(phase_steps=10, build_fraction=0.5)
    with pytest.raises(ConfigError, match="exactly one"):
        slow()
    with pytest.raises(ConfigError, match="build_fraction"):
        slow(build_fraction=1.0)
    with pytest.raises(ConfigError, match="temperature"):
        slow(phase_steps=3, temperature=0.5)


def test_slow_build_without_embedding_loss_starts_with_block_0():
    from distillpipe.config.run import SlowBuildConfig
    from distillpipe.train.schedule import build_schedule

    cfg = SlowBuildConfig(kind="slow_build", phase_steps=10, build_fraction=None, warmup_fraction=0.0,
                          temperature=2.0)
    s = build_schedule(cfg, blocks=range(2), total_steps=50, embedding_stage=False)
    # stages: block 0 from step 0, block 1 from 10, output losses from 20 (no embedding-only stage)
    assert s.weights(0)["hidden/0"] == 1.0 and s.weights(9)["attn/1"] == 0.0 and s.weights(10)["attn/1"] == 1.0
    assert s.weights(19)["hard"] == 0.0 and s.weights(20)["hard"] == 1.0 and s.weights(20)["soft"] == 1.0
    assert s.phase(0) == "build/block0" and s.phase(20) == "final"
    assert s.lr_factor(19) == 1.0 and s.lr_factor(20) == 1.0 and s.lr_factor(35) == (50 - 35) / 30
    assert s.temperature(20) == 2.0 and s.temperature(50) == 1.0


def test_unaligned_blocks_are_not_build_stages():
    """A layer_map of [-1, 3, -1, 5]: only student blocks 1 and 3 have losses, so the slow build has an
    embedding stage and two block stages (not four), and block 1 joins first."""
    from distillpipe.config.run import ObjectiveConfig
    from distillpipe.train.objective import aligned_blocks

    sched = slow(phase_steps=10)
    obj = ObjectiveConfig(loss_weights={"embedding": 1.0, "hidden": 1.0, "hard": 1.0}, hidden_loss="mse",
                          layer_map=[-1, 3, -1, 5], schedule=sched)
    assert aligned_blocks(obj) == [1, 3]
    s = build_schedule(sched, blocks=aligned_blocks(obj), total_steps=100)
    assert s.final_start == 30  # 3 stages of 10 steps, not 5
    assert active(s.weights(9)) == {"embedding"}
    b1, b3 = {"hidden/1", "attn/1", "attn_kl/1"}, {"hidden/3", "attn/3", "attn_kl/3"}
    assert active(s.weights(10)) == {"embedding"} | b1
    assert active(s.weights(20)) == {"embedding"} | b1 | b3
    assert active(s.weights(30)) == {"embedding"} | b1 | b3 | OUT
    assert [s.phase(t) for t in (0, 10, 20, 30)] == ["build/embedding", "build/block1", "build/block3", "final"]
    # No block loss weighted: no block stages at all, whatever the map says.
    plain = ObjectiveConfig(loss_weights={"soft": 1.0}, hidden_loss="mse", layer_map=[0, 1], schedule=sched)
    assert aligned_blocks(plain) == []
