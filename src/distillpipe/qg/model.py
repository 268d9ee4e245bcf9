"""The generator: a T5 built from config (embedded default) or a pretrained one, its input format and
its loading for generation.

Input format (WaLDORf: T5 : C -> Q): ``generate question: context: <context>``, or with the answer
hint ``generate question: <answer> context: <context>``. The format is recorded in ``qg.json`` beside
the weights, and the augment stage builds its inputs from that record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from distillpipe.config.qg_finetune import QgScratchModelConfig
from distillpipe.qg import QgError

QG_META = "qg.json"
PREFIX = "generate question: "
CONTEXT_TAG = "context: "


def source_text(context: str, answer: str | None) -> str:
    """The model input for one context (and an answer hint when given)."""
    hint = f"{answer} " if answer is not None else ""
    return f"{PREFIX}{hint}{CONTEXT_TAG}{context}"


def build_scratch_t5(cfg: QgScratchModelConfig, vocab_size: int):
    """A randomly initialised ``T5ForConditionalGeneration`` (seed the RNG first) with T5's id conventions:
    <pad> = 0 (also the decoder start token), </s> = 1."""
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=vocab_size, d_model=cfg.d_model, d_kv=cfg.d_kv, d_ff=cfg.d_ff, num_layers=cfg.n_encoder_layers,
        num_decoder_layers=cfg.n_decoder_layers, num_heads=cfg.n_heads,
        relative_attention_num_buckets=cfg.relative_attention_num_buckets,
        relative_attention_max_distance=cfg.relative_attention_max_distance, dropout_rate=cfg.dropout,
        feed_forward_proj=cfg.feed_forward_proj, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    return T5ForConditionalGeneration(config)


def load_pretrained_t5(model_dir: Path):
    """Model and tokenizer of a save_pretrained folder holding a ``T5ForConditionalGeneration``."""
    from transformers import AutoConfig, AutoTokenizer, T5ForConditionalGeneration

    config = AutoConfig.from_pretrained(model_dir)
    if config.model_type not in ("t5", "mt5", "umt5"):
        raise QgError(f"{model_dir} holds a {config.model_type!r} model; question generation needs a T5 "
                      "(t5-*, google/flan-t5-*, or a folder written by qg_finetune)")
    tok = AutoTokenizer.from_pretrained(model_dir)
    return T5ForConditionalGeneration.from_pretrained(model_dir), tok


def read_qg_meta(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / QG_META
    if not path.is_file():
        raise QgError(f"{path} not found: {model_dir} is not the output of qg_finetune (run `dvc repro qg_finetune`)")
    return json.loads(path.read_text(encoding="utf-8"))
