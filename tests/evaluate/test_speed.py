"""Speed harness arithmetic (with a fake forward that sleeps known times), random batches and
parameter counts on a hand-built module."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from distillpipe.evaluate.size import count_parameters
from distillpipe.evaluate.speed import measure_throughput, random_batch


class _Recorder:
    """A fake forward: sleeps the next planned duration and records what it saw."""

    def __init__(self, plan: list[float]):
        self.plan, self.calls, self.inference_mode, self.batches = list(plan), 0, [], []

    def __call__(self, batch: dict) -> None:
        self.inference_mode.append(torch.is_inference_mode_enabled())
        self.batches.append(batch["id"])
        time.sleep(self.plan[self.calls])
        self.calls += 1


def _batch_maker():
    made = []

    def make() -> dict:
        made.append(len(made))
        return {"id": made[-1]}

    return make, made


def test_warmup_is_not_timed_and_calls_are_counted():
    warmup, repeats, per = 2, 3, 2
    fwd = _Recorder([0.25] * warmup + [0.01] * (repeats * per))
    make, made = _batch_maker()
    res = measure_throughput(
        fwd, make, n_sequences_per_batch=8, warmup=warmup, repeats=repeats, batches_per_repeat=per, device="cpu"
    )
    assert fwd.calls == warmup + repeats * per
    assert len(made) == 1 + repeats  # one batch for the warm-up, one per repeat
    assert fwd.batches == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(fwd.inference_mode)
    assert len(res.seconds) == repeats
    # each repeat is two 10 ms calls; a timed warm-up call (250 ms) would show up
    assert all(0.02 <= s < 0.2 for s in res.seconds)
    assert res.sentences_per_s == pytest.approx(16 / sorted(res.seconds)[1])
    assert res.min_sentences_per_s <= res.sentences_per_s <= res.max_sentences_per_s
    assert res.to_dict()["seconds"] == list(res.seconds) and res.device == "cpu"


def test_median_not_mean():
    # five repeats of one call: four of 20 ms and one of 400 ms
    fwd = _Recorder([0.02, 0.02, 0.4, 0.02, 0.02])
    make, _ = _batch_maker()
    res = measure_throughput(
        fwd, make, n_sequences_per_batch=100, warmup=0, repeats=5, batches_per_repeat=1, device="cpu"
    )
    median_rate, mean_rate = 100 / 0.02, 100 / ((4 * 0.02 + 0.4) / 5)  # 5000 vs ~1042
    # sleep never undershoots; an overloaded machine may overshoot by a few ms
    assert median_rate / 2 < res.sentences_per_s <= median_rate * 1.01
    assert res.sentences_per_s > 2 * mean_rate
    assert res.min_sentences_per_s == pytest.approx(100 / max(res.seconds))
    assert res.min_sentences_per_s < 100 / 0.3


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="repeats"):
        measure_throughput(
            lambda b: None, dict, n_sequences_per_batch=1, warmup=0, repeats=0, batches_per_repeat=1, device="cpu"
        )


def test_random_batch():
    b = random_batch(16, 10, 5, pad_id=0, device="cpu", seed=3, pairs=True)
    assert b["input_ids"].shape == (16, 10) and b["input_ids"].dtype == torch.long
    assert b["attention_mask"].dtype == torch.bool and b["attention_mask"].all()
    assert (b["token_type_ids"] == 0).all()
    ids = torch.cat([b["input_ids"].flatten(), b["a_input_ids"].flatten(), b["b_input_ids"].flatten()])
    assert set(ids.tolist()) == {1, 2, 3, 4}  # every non-pad id, never the pad id
    assert b["a_input_ids"].shape == b["b_input_ids"].shape == (16, 5)
    assert b["a_attention_mask"].all() and b["b_attention_mask"].shape == (16, 5)
    again = random_batch(16, 10, 5, pad_id=0, device="cpu", seed=3, pairs=True)
    assert all(torch.equal(b[k], again[k]) for k in b)
    other = random_batch(16, 10, 5, pad_id=2, device="cpu", seed=4, pairs=False)
    assert set(other) == {"input_ids", "attention_mask", "token_type_ids"}
    assert set(other["input_ids"].flatten().tolist()) == {0, 1, 3, 4}


def test_count_parameters_by_hand():
    class Toy(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(10, 4)  # 40
            self.inner = nn.Sequential(nn.Linear(4, 3), nn.ReLU())  # 12 + 3 = 15
            self.pos = nn.Embedding(5, 2)  # 10
            self.bag = nn.EmbeddingBag(3, 2)  # 6
            self.decoder = nn.Linear(4, 10, bias=False)
            self.decoder.weight = self.tok.weight  # tied to the embedding: counted once, as embedding
            self.norm = nn.LayerNorm(3)  # 6
            self.shared = self.inner  # the same module twice: counted once

    counts = count_parameters(Toy())
    assert counts == {"total": 40 + 15 + 10 + 6 + 6, "without_embeddings": 15 + 6}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_measure_throughput_on_cuda():
    model = nn.Sequential(nn.Embedding(100, 32), nn.Linear(32, 32)).cuda()
    res = measure_throughput(
        lambda b: model(b["input_ids"]),
        lambda: random_batch(8, 16, 100, pad_id=0, device="cuda", seed=0, pairs=False),
        n_sequences_per_batch=8,
        warmup=2,
        repeats=3,
        batches_per_repeat=2,
        device="cuda",
    )
    assert res.device == "cuda" and len(res.seconds) == 3 and res.sentences_per_s > 0
