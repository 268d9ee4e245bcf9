"""``distillpipe predict``: raw text in, one JSON record per input row out, from an exported student.

Rows are encoded by the tokenize stage's own functions (:mod:`distillpipe.data.classification`,
:mod:`distillpipe.data.qa_windows`: the same truncation, the same QA windows), batched by length and collated as
the evaluate stage does (:func:`distillpipe.data.collate.collate`), run by the student module (PyTorch) or its
ONNX graph, and read out by the evaluate stage's code: the expected value over the bins for regression
(:func:`distillpipe.evaluate.scoring.expected_values`), the best span over a question's windows and the no-answer
threshold tuned on dev for QA (:func:`distillpipe.evaluate.squad.best_spans`, as ``squad_v2_evaluate`` applies it).

Input rows (:mod:`distillpipe.ship.rows`: a row is a line as ``wc -l`` counts it, whatever bytes it holds): one
text, two texts (a sentence pair) or a question and its context, from ``--text`` values, a file of lines (the two
fields of a pair or a QA row separated by the first TAB) or a TSV file with a header naming its columns
(:data:`COLUMNS`; an ``id`` column is copied into the records). A bad row (empty, too long, a pair or QA row without
its second field; bytes that are not UTF-8 with ``invalid_utf8="error"``) gets a record with an ``error`` and a
message; every other row is predicted: one record per row, in input order, always.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.special import softmax

from distillpipe.data.batching import length_batches
from distillpipe.data.classification import classification_columns
from distillpipe.data.collate import collate
from distillpipe.data.qa_windows import qa_window_columns
from distillpipe.evaluate.scoring import expected_values
from distillpipe.evaluate.squad import best_spans
from distillpipe.progress import Progress
from distillpipe.ship.bundle import ONNX_FILE, load_model, load_tokenizer, read_config
from distillpipe.ship.onnx import refusal
from distillpipe.ship.quantize import INT8_ONNX_FILE, INT8_TORCH_FILE, int8_file, load_torch_int8
from distillpipe.ship.rows import (  # noqa: F401 (re-exported: the rows are part of predict's API)
    COLUMNS,
    PredictInputError,
    Row,
    rows_from_lines,
    rows_from_texts,
    rows_from_tsv,
    what,
)
from distillpipe.ship.runners import OnnxRunner, TorchRunner

log = logging.getLogger(__name__)

INVALID_UTF8 = ("replace", "error")
"""What predict does with a row holding bytes that are not UTF-8: predict it as decoded (U+FFFD in their place),
flagged with ``invalid_utf8_offset``, or give it an error record naming the offset."""


@dataclass
class PredictSummary:
    rows: int = 0
    errors: int = 0
    truncated: int = 0
    invalid_utf8: int = 0
    """Rows predicted with U+FFFD in place of bytes that are not UTF-8 (``invalid_utf8="replace"``)."""
    seconds: float = 0.0
    messages: list[str] = field(default_factory=list)
    """One per bad or truncated row: what and where (the CLI prints them)."""

    def one_line(self) -> str:
        rate = self.rows / self.seconds if self.seconds > 0 else float("inf")
        bad = f", {self.invalid_utf8:,} with bytes that are not UTF-8 replaced" if self.invalid_utf8 else ""
        return (f"predict: {self.rows:,} rows ({self.errors:,} with an error, {self.truncated:,} truncated{bad}) in "
                f"{self.seconds:.1f} s, {rate:,.0f} rows/s")


def shape_of(config: dict[str, Any]) -> str:
    """``single``, ``pair`` or ``qa``: what a row of this model holds."""
    if config["task_type"] == "qa":
        return "qa"
    return "pair" if config["text_pair"] else "single"


def check_row(row: Row, shape: str, max_chars: int, invalid_utf8: str = "replace") -> str | None:
    """What is wrong with ``row`` for this model, or None."""
    if row.invalid_utf8_offset is not None and invalid_utf8 == "error":
        return (f"bytes that are not UTF-8, the first at byte offset {row.invalid_utf8_offset:,} (--invalid-utf8 "
                "error; with replace, the row is predicted with U+FFFD in their place)")
    if not any(f.strip() for f in row.fields):
        return "empty input"
    if shape != "single" and len(row.fields) < 2:
        second = "context" if shape == "qa" else "second sentence"
        first = "question" if shape == "qa" else "first sentence"
        return (f"no {second}: this model reads {what(shape)}; give the {first} and the {second} separated by a "
                "TAB (or a TSV file with a header)")
    for name, f in zip(("question", "context") if shape == "qa" else ("text", "second text"), row.fields):
        if not f.strip():
            return f"empty {name}"
        if len(f) > max_chars:
            return f"{name} of {len(f):,} characters, over the limit of {max_chars:,} (--max-chars)"
    return None


class Predictor:
    """An exported student, ready to predict: its config, tokenizer and runtime (``torch`` or ``onnx``)."""

    def __init__(self, folder: str | Path, *, runtime: str = "torch", device: torch.device = torch.device("cpu"),
                 threads: int | None = None):
        self.folder = Path(folder)
        self.config = read_config(self.folder)
        self.tokenizer = load_tokenizer(self.folder, self.config)
        self.shape = shape_of(self.config)
        outputs = ["start_logits", "end_logits"] if self.config["task_type"] == "qa" else ["logits"]
        if runtime == "torch":
            model, _ = load_model(self.folder, device)
            self.runner = TorchRunner(model, device, outputs)
        elif runtime == "onnx":
            onnx = self.config.get("onnx")
            if not onnx or not (self.folder / ONNX_FILE).is_file():
                why = refusal(self.config["student"], (self.config["task"]["head"] or {}).get("type"))
                raise PredictInputError(f"{self.folder} has no {ONNX_FILE}: " + (
                    f"this student cannot be exported to ONNX ({why}); predict with --runtime torch" if why else
                    f"export it with `distillpipe export {self.config['run']} --onnx`, or predict with "
                    "--runtime torch"))
            self.runner = OnnxRunner(self.folder / ONNX_FILE, onnx, device, threads)
        elif runtime in ("onnx-int8", "torch-int8"):  # export --quantize dynamic (ship/quantize.py)
            q = self.config.get("quantized")
            file = INT8_ONNX_FILE if runtime == "onnx-int8" else INT8_TORCH_FILE
            if not q or q["file"] != file or not (self.folder / file).is_file():
                raise PredictInputError(f"{self.folder} has no {file}: " + (
                    f"its int8 student is {q['file']} (--runtime {'onnx' if q['file'] == INT8_ONNX_FILE else 'torch'}"
                    "-int8)" if q else f"export it with `distillpipe export {self.config['run']} --quantize dynamic`"))
            path = int8_file(self.folder, self.config)
            if runtime == "onnx-int8":
                self.runner = OnnxRunner(path, self.config["onnx"], device, threads)
            else:
                model, _ = load_model(self.folder, torch.device("cpu"))
                self.runner = TorchRunner(load_torch_int8(model, path), torch.device("cpu"), outputs)
        else:
            raise PredictInputError(f"unknown runtime {runtime!r}: torch, onnx, onnx-int8 or torch-int8")

    def predict(self, rows: list[Row], *, batch_size: int = 32, max_chars: int = 100_000,
                invalid_utf8: str = "replace", progress: bool = False) -> tuple[list[dict[str, Any]], PredictSummary]:
        """One record per row, in input order, and a summary. ``invalid_utf8``: :data:`INVALID_UTF8`."""
        if invalid_utf8 not in INVALID_UTF8:
            raise PredictInputError(f"invalid_utf8={invalid_utf8!r}: one of {', '.join(INVALID_UTF8)}")
        t0 = time.perf_counter()
        summary = PredictSummary(rows=len(rows))
        records: list[dict[str, Any]] = []
        good: list[int] = []
        notes: list[tuple[int, str]] = []  # (line, what), for the messages
        for i, row in enumerate(rows):
            rec: dict[str, Any] = {"line": row.line} | ({"id": row.id} if row.id is not None else {})
            problem = check_row(row, self.shape, max_chars, invalid_utf8)
            if problem is not None:
                rec["error"] = problem
                summary.errors += 1
                notes.append((row.line, problem))
            else:
                good.append(i)
                if row.invalid_utf8_offset is not None:
                    rec["invalid_utf8_offset"] = row.invalid_utf8_offset
                    summary.invalid_utf8 += 1
                    notes.append((row.line, f"bytes that are not UTF-8, the first at byte offset "
                                            f"{row.invalid_utf8_offset:,}: predicted with U+FFFD in their place"))
            records.append(rec)
        if good:
            chosen = [rows[i] for i in good]
            outs = self._qa(chosen, batch_size, progress) if self.shape == "qa" else \
                self._classify(chosen, batch_size, progress)
            for i, (out, cut) in zip(good, outs):
                records[i] |= out
                if cut:
                    records[i]["truncated"] = True
                    summary.truncated += 1
                    notes.append((rows[i].line, cut))
        summary.messages = [f"line {line}: {note}" for line, note in sorted(notes, key=lambda n: n[0])]
        summary.seconds = time.perf_counter() - t0
        return records, summary

    # ------------------------------------------------------------------------------------------ forward

    def _forward(self, cols: dict[str, list], kind: str, batch_size: int, progress: bool) -> list[dict[str, Any]]:
        """Run the model over token rows bucketed by length (as evaluate does); per row its outputs (QA start/end
        logits cut to the row's length)."""
        n = len(cols["length"])
        out: list[dict[str, Any]] = [{} for _ in range(n)]
        pairs = self.config["task"]["encoding"] == "diffcat"
        task = self.config["task"]
        bar = Progress(total=n, desc="predict", unit="rows", disable=not progress)
        with bar:
            for idx in length_batches(np.asarray(cols["length"]), batch_size):
                rows = {k: [v[i] for i in idx] for k, v in cols.items()}
                batch, _ = collate(rows, kind=kind, pad_id=task["pad_id"], labeled=False, pairs=pairs,
                                   bin_width=task["bin_width"])
                res = self.runner(batch)
                for j, r in enumerate(idx):
                    if kind == "qa":
                        length = cols["length"][r]
                        out[r] = {"start": res["start_logits"][j, :length], "end": res["end_logits"][j, :length]}
                    else:
                        out[r] = {"logits": res["logits"][j]}
                bar.update(len(idx))
        return out

    def _classify(self, rows: list[Row], batch_size: int, progress: bool) -> list[tuple[dict[str, Any], str]]:
        tok, max_len = self.tokenizer, self.config["max_length"]
        pair = self.shape == "pair"
        batch = {"id": [str(r.line) for r in rows], "text_a": [r.fields[0] for r in rows],
                 "label": [-1] * len(rows)}
        if pair:
            batch["text_b"] = [r.fields[1] for r in rows]
        cols, _ = classification_columns(tok, batch, pair, max_len)
        # the tokenize stage truncates over-long rows the same way; say which, with their untruncated length
        full = tok(batch["text_a"], batch["text_b"]) if pair else tok(batch["text_a"])
        outs = self._forward(cols, "classification", batch_size, progress)
        bin_width = self.config["task"]["bin_width"]
        labels = self.config["label_names"]
        results = []
        for o, ids in zip(outs, full["input_ids"]):
            logits = o["logits"].astype(np.float64)  # (C,)
            if bin_width is not None:
                rec = {"score": float(expected_values(logits[None], bin_width)[0])}
            else:
                p = softmax(logits)
                k = int(p.argmax())
                names = labels or [str(c) for c in range(len(p))]
                rec = {"label": names[k], "label_id": k, "probabilities": {n: float(v) for n, v in zip(names, p)}}
            cut = len(ids) > max_len
            results.append((rec, f"{len(ids):,} tokens, cut to {max_len} as in training (the model reads the first "
                                 f"{max_len})" if cut else ""))
        return results

    def _qa(self, rows: list[Row], batch_size: int, progress: bool) -> list[tuple[dict[str, Any], str]]:
        qa = self.config["qa"]
        tok = self.tokenizer
        examples = [{"id": str(i), "question": r.fields[0], "context": r.fields[1]} for i, r in enumerate(rows)]
        batch = {"id": [e["id"] for e in examples], "question": [e["question"] for e in examples],
                 "context": [e["context"] for e in examples],
                 "answers": [{"text": [], "answer_start": []}] * len(examples)}
        cols, _ = qa_window_columns(tok, batch, self.config["max_length"], qa["doc_stride"], qa["max_query_len"])
        outs = self._forward(cols, "qa", batch_size, progress)
        windows = [{"example_id": e, "offset_mapping": o} for e, o in zip(cols["example_id"], cols["offset_mapping"])]
        spans = best_spans(examples, windows, [o["start"] for o in outs], [o["end"] for o in outs])
        q_len = [len(ids) for ids in tok(batch["question"], add_special_tokens=False)["input_ids"]]
        threshold = qa["threshold"]
        results = []
        for e, n in zip(examples, q_len):
            span = spans[e["id"]]
            answer = "" if span.null_margin > threshold else span.text  # squad_v2_evaluate's rule
            rec = {"answer": answer, "has_answer": bool(answer), "best_span": span.text,
                   "no_answer_score": span.null_margin, "threshold": threshold}
            cut = n > qa["max_query_len"]
            results.append((rec, f"question of {n:,} tokens, cut to {qa['max_query_len']} as in training" if cut
                            else ""))
        return results
