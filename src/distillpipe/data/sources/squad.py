"""Extractive QA from SQuAD v1.1 / v2.0 JSON (``data[].paragraphs[].qas[]``), flattened to the
``qa`` schema. Every answer must be found at its ``answer_start`` in the context: a mismatch is
an error naming the question id, because a wrong offset silently teaches a wrong span."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from tqdm import tqdm

from distillpipe.config.prepare import LocalSquadConfig
from distillpipe.data.features import rows_to_dataset
from distillpipe.data.sources.base import Prepared, PrepareError, Skips, input_path, read_text, shorten

logger = logging.getLogger(__name__)


def squad_rows(doc: Any, where: str) -> list[dict]:
    """Rows of the qa schema from a parsed SQuAD document; ``where`` names it in errors."""
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise PrepareError(f"{where}: not SQuAD JSON (expected an object with a `data` list of articles)")
    rows = []
    for a, article in enumerate(tqdm(doc["data"], desc="articles", unit="article", disable=None, leave=False)):
        try:
            title = _string(article.get("title", ""), f"{where}: data[{a}].title")
            for p, paragraph in enumerate(article["paragraphs"]):
                context = _string(paragraph["context"], f"{where}: data[{a}].paragraphs[{p}].context")
                for qa in paragraph["qas"]:
                    rows.append(_row(qa, title, context, where))
        except (KeyError, TypeError, AttributeError) as e:
            raise PrepareError(
                f"{where}: data[{a}] (title {article.get('title') if isinstance(article, dict) else None!r}) "
                f"lacks a SQuAD field ({e!r}); expected paragraphs[].context and paragraphs[].qas[]"
            ) from None
    return rows


def _string(value: Any, what: str) -> str:
    """``value`` when it is a string, else a PrepareError naming ``what`` (a number or a list there would otherwise
    fail deep inside Arrow)."""
    if not isinstance(value, str):
        raise PrepareError(f"{what} is {type(value).__name__} {shorten(value, 80)}, not a string; fix it in the file")
    return value


def _row(qa: dict, title: str, context: str, where: str) -> dict:
    qid = qa["id"]
    question = _string(qa["question"], f"{where}: question {qid!r}: question")
    answers = [] if qa.get("is_impossible", False) else qa["answers"]
    if not answers and not qa.get("is_impossible", False):
        raise PrepareError(
            f"{where}: question {qid!r} has no answers and is not marked `is_impossible: true`; "
            "fix or remove it in the file"
        )
    texts, starts = [], []
    for answer in answers:
        text, start = _string(answer["text"], f"{where}: question {qid!r}: an answer's text"), answer["answer_start"]
        if isinstance(start, bool) or not isinstance(start, int):
            raise PrepareError(f"{where}: question {qid!r}: answer_start is {shorten(start, 80)}, not a whole number "
                               "(a character offset into the context); fix it in the file")
        if context[start : start + len(text)] != text:
            found = context.find(text)
            hint = f" (the text occurs at {found})" if found >= 0 else " (the text is not in the context)"
            raise PrepareError(
                f"{where}: question {qid!r}: answer {text!r} is not at answer_start={start} of its context, "
                f"which reads {context[start:start + len(text)]!r} there{hint}; fix answer_start in the file"
            )
        texts.append(text)
        starts.append(start)
    return {"id": str(qid), "title": title, "context": context, "question": question,
            "answers": {"text": texts, "answer_start": starts}}


def build_squad(name: str, cfg: LocalSquadConfig) -> Prepared:
    key = f"prepare.local.{name}"
    if not cfg.files:
        raise PrepareError(f"{key}.files is empty; give at least `train: path/to/train-v2.0.json`")
    splits = {}
    for split, file in cfg.files.items():
        path: Path = input_path(Path(cfg.path) / file, f"{key}.files.{split}")
        text = read_text(path, cfg.encoding, f"{key}.encoding")
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise PrepareError(f"{path}:{e.lineno}: invalid JSON ({e.msg}, column {e.colno}); "
                               "is this a SQuAD file?") from None
        except RecursionError:
            raise PrepareError(f"{path}: JSON nested too deeply to read; is this a SQuAD file?") from None
        rows = squad_rows(doc, str(path))
        if not rows:
            raise PrepareError(f"{path}: no questions found (from params.yaml `{key}.files.{split}`)")
        logger.info("%s: %d questions, %d unanswerable", path, len(rows), sum(not r["answers"]["text"] for r in rows))
        splits[split] = rows_to_dataset(rows, "qa", ["question", "context"])
    return Prepared(splits, "qa", [], ["question", "context"], Skips())
