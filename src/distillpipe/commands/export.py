"""``distillpipe export``: a trained, evaluated student as a self-contained folder (not a DVC stage)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated, Literal

import typer

from distillpipe.commands.base import ParamsOpt, user_errors
from distillpipe.ship.card_meta import TEACHER_LICENSE
from distillpipe.ship.export import export_run
from distillpipe.students import RECORD_FILE


@user_errors
def export(run: Annotated[str, typer.Argument(help="the run to export (a key of train/finetune/... runs)")],
           out: Annotated[Path, typer.Option(help="the folder to write (replaced if it is an earlier export)")],
           onnx: Annotated[bool, typer.Option(help="also write model.onnx (dynamic batch and length axes), "
                                                   "checked against PyTorch")] = False,
           quantize: Annotated[Literal["none", "dynamic"], typer.Option(
               help="dynamic: also an int8 student (model.int8.onnx from model.onnx, which it implies, or "
                    "model.int8.pt where ONNX cannot go), refused if its dev/test predictions differ from the float "
                    "student's beyond tolerance")] = "none",
           prepared: Annotated[Path | None, typer.Option(help="the prepared dataset (QA --quantize scores its "
                                                              "examples) [data/prepared/<dataset>]")] = None,
           student: Annotated[Path | None, typer.Option(help="student folder [models/students/<run>]")] = None,
           tokens: Annotated[Path | None, typer.Option(help="its tokens [data/tokens/<dataset>]")] = None,
           metrics: Annotated[Path | None, typer.Option(help="evaluate's scores [metrics/students/<run>.json]")]
           = None,
           predictions: Annotated[Path | None, typer.Option(help="evaluate's per-example records "
                                                                 "[predictions/<run>.json]")] = None,
           speed: Annotated[Path | None, typer.Option(help="the speed stage's record, if any "
                                                           "[metrics/speed/<run>.json]")] = None,
           tokenizer: Annotated[Path | None, typer.Option(help="the tokenizer folder [the one the tokens name]")]
           = None,
           license: Annotated[str, typer.Option(help="the card's license, a Hub license id (apache-2.0, mit, "
                                                     "cc-by-4.0, other, ...); teacher = the base teacher's, as its "
                                                     "model card declares it")] = TEACHER_LICENSE,
           params: ParamsOpt = Path("params.yaml")) -> None:
    """Export a run's student: safetensors weights, config.json, tokenizer, a model card (and model.onnx)."""
    for noisy, level in (("onnx_ir", logging.WARNING), ("onnxscript", logging.WARNING),  # a line per graph rewrite
                         ("torch.onnx._internal.exporter._registration", logging.ERROR)):  # "torchvision is not..."
        logging.getLogger(noisy).setLevel(level)
    student = student or Path("models/students") / run
    if tokens is None:
        record = student / RECORD_FILE
        if not record.is_file():
            raise FileNotFoundError(f"{record} not found: {student} is not a trained student "
                                    f"(run `dvc repro` for {run}, or pass --student)")
        tokens = Path("data/tokens") / json.loads(record.read_text())["record"]["dataset"]
    s = export_run(run, out_dir=out, student_dir=student, tokens_dir=tokens,
                   metrics_path=metrics or Path("metrics/students") / f"{run}.json",
                   predictions_path=predictions or Path("predictions") / f"{run}.json",
                   speed_path=speed or Path("metrics/speed") / f"{run}.json", params_path=params,
                   tokenizer_dir=tokenizer, onnx=onnx, root=params.resolve().parent, license=license,
                   quantize=quantize, prepared_dir=prepared)
    typer.echo(s.one_line())
