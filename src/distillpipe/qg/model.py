"""The generator's input format, its record (``qg.json``) and its loading for generation (a T5 built from config is
``qg_finetune``'s: :func:`distillpipe.qg.finetune.build_scratch_t5`, so augment holds no fine-tuning config).

Input format (WaLDORf: T5 : C -> Q): ``generate question: context: <context>``, or with the answer
hint ``generate question: <answer> context: <context>``. The format is recorded in ``qg.json`` beside
the weights, and the augment stage builds its inputs from that record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from distillpipe.qg import QgError

QG_META = "qg.json"
PREFIX = "generate question: "
CONTEXT_TAG = "context: "


def source_text(context: str, answer: str | None) -> str:
    """The model input for one context (and an answer hint when given)."""
    hint = f"{answer} " if answer is not None else ""
    return f"{PREFIX}{hint}{CONTEXT_TAG}{context}"


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
