"""Inference-speed harness and parameter counts (CMOW paper Table V; WaLDORf appendix speed test).

Protocol (CMOW paper, sec. IV): encode batches of random sequences (256 sequences of length 64)
without gradients and report sentences per second. Done here with the care such numbers need:

* everything runs under ``torch.inference_mode()``;
* warm-up calls (allocator, cuDNN/kernel selection, lazy init) are made first and not timed;
* each repeat times ``batches_per_repeat`` forward calls with ``time.perf_counter``, bracketed by
  ``torch.cuda.synchronize`` on CUDA so that queued kernels are inside the timed region;
* batches are built before the timed region (one per repeat), so data generation is not timed;
* the reported rate is the median over repeats (robust to a stray slow repeat), with min/max and
  the raw per-repeat seconds kept for the record.

Speed numbers depend on the device, thread count, batch size and sequence length: a speed-up is
only meaningful between two measurements taken by the same harness on the same machine in the
same run, which is how the ``evaluate`` stage uses it (student and teacher back to back).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpeedResult:
    """Throughput of one model under :func:`measure_throughput`."""

    device: str
    """Device the batches ran on, e.g. ``cpu`` or ``cuda:0``."""
    n_sequences_per_batch: int
    batches_per_repeat: int
    warmup: int
    """Untimed forward calls made before the first repeat."""
    repeats: int
    seconds: tuple[float, ...]
    """Wall-clock seconds of each repeat (``batches_per_repeat`` forward calls)."""
    sentences_per_s: float
    """Median over repeats of sequences per second."""
    min_sentences_per_s: float
    max_sentences_per_s: float
    torch_threads: int
    """``torch.get_num_threads()`` during the measurement (what CPU numbers depend on)."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["seconds"] = list(self.seconds)
        return d


def measure_throughput(
    forward: Callable[[dict], Any],
    make_batch: Callable[[], dict],
    *,
    n_sequences_per_batch: int,
    warmup: int,
    repeats: int,
    batches_per_repeat: int,
    device: torch.device | str,
) -> SpeedResult:
    """Sequences per second of ``forward`` on batches from ``make_batch`` (see the module docstring).

    ``forward(batch)`` runs the model on one batch (its output is ignored); ``make_batch()`` returns a
    batch already on ``device`` holding ``n_sequences_per_batch`` sequences. ``make_batch`` is called
    once for the warm-up and once per repeat, outside the timed regions. ``forward`` is called
    ``warmup + repeats * batches_per_repeat`` times in all.
    """
    if n_sequences_per_batch < 1 or repeats < 1 or batches_per_repeat < 1 or warmup < 0:
        raise ValueError(
            f"measure_throughput: need n_sequences_per_batch, repeats, batches_per_repeat >= 1 and "
            f"warmup >= 0; got {n_sequences_per_batch}, {repeats}, {batches_per_repeat}, {warmup}"
        )
    device = torch.device(device)
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    seconds: list[float] = []
    with torch.inference_mode():
        batch = make_batch()
        for _ in range(warmup):
            forward(batch)
        sync()
        for _ in range(repeats):
            batch = make_batch()
            sync()
            t0 = time.perf_counter()
            for _ in range(batches_per_repeat):
                forward(batch)
            sync()
            seconds.append(time.perf_counter() - t0)
    n = n_sequences_per_batch * batches_per_repeat
    rates = [n / max(s, 1e-12) for s in seconds]
    result = SpeedResult(
        device=str(device),
        n_sequences_per_batch=n_sequences_per_batch,
        batches_per_repeat=batches_per_repeat,
        warmup=warmup,
        repeats=repeats,
        seconds=tuple(seconds),
        sentences_per_s=float(statistics.median(rates)),
        min_sentences_per_s=min(rates),
        max_sentences_per_s=max(rates),
        torch_threads=torch.get_num_threads(),
    )
    log.info(
        "throughput on %s: %.1f sentences/s (median of %d repeats, range %.1f-%.1f)",
        result.device,
        result.sentences_per_s,
        repeats,
        result.min_sentences_per_s,
        result.max_sentences_per_s,
    )
    return result


def random_batch(
    batch_size: int, seq_len: int, vocab_size: int, *, pad_id: int, device: torch.device | str, seed: int, pairs: bool
) -> dict[str, torch.Tensor]:
    """A batch of random token sequences with no padding (the CMOW paper's speed protocol: 256 x 64).

    Keys: ``input_ids`` (B, L) long in ``[0, vocab_size)`` without ``pad_id``, ``attention_mask``
    (B, L) bool all True, ``token_type_ids`` (B, L) zeros. ``pairs=True`` adds the DiffCat inputs
    ``a_input_ids``/``b_input_ids`` (B, L // 2) with all-True ``a_attention_mask``/``b_attention_mask``.
    Seeded on the CPU, so a seed gives the same ids on every device.
    """
    if batch_size < 1 or seq_len < 2 or vocab_size < 2 or not 0 <= pad_id < vocab_size:
        raise ValueError(
            f"random_batch: need batch_size >= 1, seq_len >= 2, vocab_size >= 2 and pad_id in "
            f"[0, vocab_size); got {batch_size}, {seq_len}, {vocab_size}, pad_id={pad_id}"
        )
    g = torch.Generator().manual_seed(seed)

    def ids(length: int) -> torch.Tensor:
        x = torch.randint(0, vocab_size - 1, (batch_size, length), generator=g)  # (B, length)
        return (x + (x >= pad_id).long()).to(device)  # skip pad_id: vocabulary minus one id, shifted

    def ones(length: int) -> torch.Tensor:
        return torch.ones(batch_size, length, dtype=torch.bool, device=device)

    batch = {
        "input_ids": ids(seq_len),
        "attention_mask": ones(seq_len),
        "token_type_ids": torch.zeros(batch_size, seq_len, dtype=torch.long, device=device),
    }
    if pairs:
        half = seq_len // 2
        batch |= {
            "a_input_ids": ids(half),
            "a_attention_mask": ones(half),
            "b_input_ids": ids(half),
            "b_attention_mask": ones(half),
        }
    return batch
