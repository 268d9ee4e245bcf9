"""Batched question generation: inputs sorted by length (little padding), seeded per batch (sampling
is reproducible and independent of what ran before), results returned in input order.

On CUDA the model runs under bf16 autocast and, when ``static_cache`` is asked for and the model
supports it (T5 does in transformers 5: ``_can_compile_fullgraph``), with a static KV cache, which
lets transformers compile the decoding step; inputs are then padded to a multiple of
``CUDA_PAD_MULTIPLE`` tokens so that few distinct shapes are compiled. The CPU path is plain eager
generation with the default dynamic cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from distillpipe.config.decoding import BeamDecodingConfig, DecodingConfig, GreedyDecodingConfig, SampleDecodingConfig
from distillpipe.data.batching import length_mask, pad_sequences
from distillpipe.runtime import autocast

CUDA_PAD_MULTIPLE = 64


@dataclass
class GenerationStats:
    inputs: int = 0
    sequences: int = 0
    new_tokens: int = 0
    """Generated tokens (the closing </s> included, padding after it not): see :func:`generated_lengths`."""
    truncated: int = 0
    """Inputs longer than ``max_source_len`` (cut, keeping </s>)."""
    seconds: float = 0.0

    def add(self, other: GenerationStats) -> None:
        for k in ("inputs", "sequences", "new_tokens", "truncated", "seconds"):
            setattr(self, k, getattr(self, k) + getattr(other, k))


def decoding_kwargs(decoding: DecodingConfig, n: int, max_new_tokens: int, no_repeat_ngram_size: int) -> dict[str, Any]:
    """``generate()`` arguments for a decoding config (every value explicit: nothing comes from the
    model's saved generation_config)."""
    kw: dict[str, Any] = {"max_new_tokens": max_new_tokens, "num_return_sequences": n,
                          "no_repeat_ngram_size": no_repeat_ngram_size, "do_sample": False, "num_beams": 1}
    if isinstance(decoding, BeamDecodingConfig):
        kw.update(num_beams=decoding.num_beams, length_penalty=decoding.length_penalty, early_stopping=True)
    elif isinstance(decoding, SampleDecodingConfig):
        kw.update(do_sample=True, temperature=decoding.temperature, top_k=decoding.top_k, top_p=decoding.top_p)
    else:
        assert isinstance(decoding, GreedyDecodingConfig), decoding
    return kw


def encode_sources(tok: Any, sources: Sequence[str], max_source_len: int) -> tuple[list[list[int]], int]:
    """Token ids of each source (ending in </s>), cut to ``max_source_len``; and how many were cut."""
    ids = tok(list(sources), add_special_tokens=True, return_attention_mask=False)["input_ids"]
    eos, cut = tok.eos_token_id, 0
    for i, x in enumerate(ids):
        if len(x) > max_source_len:
            ids[i], cut = x[: max_source_len - 1] + [eos], cut + 1
    return ids, cut


def batch_seed(seed: Sequence[int], batch: int) -> int:
    """A seed for one batch, derived from the caller's seed tuple (e.g. (run seed, chunk))."""
    return int(np.random.SeedSequence([*seed, batch]).generate_state(1)[0])


def generated_lengths(body: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Tokens generated per sequence (B, T) -> (B,): up to and including the first </s>, else all T (the
    padding after </s> is not generated; a token equal to <pad> before any </s> is)."""
    is_eos = body == eos_id
    first = is_eos.int().argmax(1)  # (B,) index of the first </s> (0 when there is none)
    return torch.where(is_eos.any(1), first + 1, torch.full_like(first, body.shape[1]))


@torch.inference_mode()
def generate_questions(model: Any, tok: Any, sources: Sequence[str], gen_kwargs: dict[str, Any], *,
                       batch_size: int, max_source_len: int, device: torch.device, seed: Sequence[int],
                       sort_by_length: bool = True, static_cache: bool = False,
                       on_batch: Callable[[int], None] | None = None) -> tuple[list[list[str]], GenerationStats]:
    """Generate ``gen_kwargs["num_return_sequences"]`` questions per source, in source order.

    ``sort_by_length=False`` (one-by-one or unsorted batches) exists for the benchmark.
    ``on_batch(n_inputs)`` is called after each batch (progress bars).
    """
    t0 = time.perf_counter()
    n = gen_kwargs["num_return_sequences"]
    was_training = model.training
    model.eval()
    ids, truncated = encode_sources(tok, sources, max_source_len)
    lengths = np.array([len(x) for x in ids])
    order = np.argsort(lengths, kind="stable") if sort_by_length else np.arange(len(ids))
    kwargs = dict(gen_kwargs)
    cuda = device.type == "cuda"
    if cuda and static_cache and getattr(model, "_can_compile_fullgraph", False):
        kwargs["cache_implementation"] = "static"
    pad = tok.pad_token_id
    out: list[list[str]] = [[] for _ in ids]
    stats = GenerationStats(inputs=len(ids), truncated=truncated)
    for b, start in enumerate(range(0, len(ids), batch_size)):
        idx = order[start:start + batch_size]
        width = int(lengths[idx].max())
        if cuda:
            width = -(-width // CUDA_PAD_MULTIPLE) * CUDA_PAD_MULTIPLE
        input_ids = pad_sequences([ids[i] for i in idx], pad, length=width)  # (B, S)
        attention_mask = length_mask(torch.as_tensor(lengths[idx]), width).long()  # (B, S)
        torch.manual_seed(batch_seed(seed, b))  # sampling draws from the global RNG (CUDA's too)
        with autocast(device):
            seqs = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), **kwargs)
        seqs = seqs.cpu()  # (B * n, 1 + T): decoder start token, then the question
        stats.new_tokens += int(generated_lengths(seqs[:, 1:], tok.eos_token_id).sum())
        stats.sequences += seqs.shape[0]
        texts = tok.batch_decode(seqs, skip_special_tokens=True)
        for j, i in enumerate(idx):
            out[i] = [t.strip() for t in texts[j * n:(j + 1) * n]]
        if on_batch is not None:
            on_batch(len(idx))
    model.train(was_training)
    stats.seconds = time.perf_counter() - t0
    return out, stats
