"""``distillpipe predict``: an exported student on text (``--text``, a file of lines or TSV, stdin), JSON lines out."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer

from distillpipe.commands.base import user_errors
from distillpipe.runtime import resolve_device
from distillpipe.ship.predict import PredictInputError, Predictor, rows_from_lines, rows_from_texts, rows_from_tsv

SHOWN_MESSAGES = 10


@user_errors
def predict(folder: Annotated[Path, typer.Argument(help="an exported student (distillpipe export)")],
            text: Annotated[list[str] | None, typer.Option(help="a text to predict; repeat for more. A pair or QA "
                                                                "row: its two fields separated by a TAB")] = None,
            input: Annotated[Path | None, typer.Option(help="a file of lines, or a .tsv with a header; - = stdin "
                                                           "(the default without --text)")] = None,
            format: Annotated[Literal["auto", "lines", "tsv"], typer.Option(
                help="how to read --input: auto = tsv for *.tsv, lines otherwise")] = "auto",
            out: Annotated[Path | None, typer.Option(help="JSON lines file to write [stdout]")] = None,
            runtime: Annotated[Literal["torch", "onnx", "onnx-int8", "torch-int8"], typer.Option(
                help="PyTorch, or ONNX Runtime on model.onnx; the int8 student of export --quantize dynamic: "
                     "onnx-int8 (model.int8.onnx) or torch-int8 (model.int8.pt, CPU)")] = "torch",
            device: Annotated[str, typer.Option(help="auto, cpu or cuda[:i]")] = "auto",
            batch_size: Annotated[int, typer.Option(help="rows per forward")] = 32,
            max_chars: Annotated[int, typer.Option(help="longer fields are refused (an error record)")] = 100_000,
            invalid_utf8: Annotated[Literal["replace", "error"], typer.Option(
                help="a row with bytes that are not UTF-8: predict it with U+FFFD in their place (flagged with "
                     "their byte offset), or give it an error record naming the offset")] = "replace",
            ) -> None:
    """Predict with an exported student: one JSON line per input row (labels and probabilities, a score, or an
    answer span), in input order; a bad row gets an "error" field and a message, the others are predicted."""
    if batch_size < 1 or max_chars < 1:
        raise PredictInputError("--batch-size and --max-chars must be >= 1")
    p = Predictor(folder, runtime=runtime, device=resolve_device(device))
    if text and input is not None:
        raise PredictInputError("give --text or --input, not both")
    if text:
        rows, progress = rows_from_texts(text, p.shape), False
    else:
        source = input or Path("-")
        where = "stdin" if str(source) == "-" else str(source)
        if where != "stdin" and not source.is_file():
            raise FileNotFoundError(f"{source} not found")
        if where == "stdin" and sys.stdin.isatty():
            typer.echo("reading rows from stdin, one per line; end with Ctrl-D (or give --text / --input)", err=True)
        raw = sys.stdin.buffer.read() if where == "stdin" else source.read_bytes()  # rows are split as bytes
        tsv = format == "tsv" or (format == "auto" and source.suffix.lower() == ".tsv")
        rows = rows_from_tsv(raw, p.shape, where) if tsv else rows_from_lines(raw, p.shape)
        progress = where != "stdin"
    records, summary = p.predict(rows, batch_size=batch_size, max_chars=max_chars, invalid_utf8=invalid_utf8,
                                 progress=progress)
    lines = "".join(json_line(r) for r in records).encode("utf-8")
    if out is None:
        sys.stdout.flush()
        sys.stdout.buffer.write(lines)  # UTF-8 whatever the terminal's encoding
        sys.stdout.buffer.flush()  # before the warnings on stderr, so that a terminal shows them after the records
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(lines)
    for m in summary.messages[:SHOWN_MESSAGES]:
        typer.secho(f"warning: {m}", fg=typer.colors.YELLOW, err=True)
    if len(summary.messages) > SHOWN_MESSAGES:
        typer.secho(f"warning: ... and {len(summary.messages) - SHOWN_MESSAGES} more (see the records)",
                    fg=typer.colors.YELLOW, err=True)
    typer.echo(summary.one_line(), err=True)


LINE_BREAKS = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"}
"""Line breaks JSON leaves unescaped (it escapes only U+0000-U+001F): escaped, so that a record (an answer span or an
id holding one) stays one line for every reader, str.splitlines included."""


def json_line(record: dict) -> str:
    """One record as one line of JSON: one ``\\n``, at its end, and no other line break."""
    text = json.dumps(_finite(record), ensure_ascii=False)
    for char, escaped in LINE_BREAKS.items():
        text = text.replace(char, escaped)  # inside a JSON string: these characters occur only in strings
    return text + "\n"


def _finite(record: dict) -> dict:
    """JSON has no infinity: a QA no-answer score with no span at all is written as null."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
