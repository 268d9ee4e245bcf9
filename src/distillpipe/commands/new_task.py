"""``distillpipe new-task``: add a task from your files to params.yaml in one step (:mod:`distillpipe.scaffold`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from distillpipe.commands.base import ParamsOpt, user_errors
from distillpipe.config.base import ConfigError
from distillpipe.scaffold import add_task

Format = Literal["glue", "squad", "text", "jsonl"]


@user_errors
def new_task(name: Annotated[str, typer.Argument(help="the new dataset's name (e.g. sst2)")],
             like: Annotated[str, typer.Option(help="an existing dataset of the same kind to copy the settings of "
                                                    "(polarity, wiki_pairs: classification; wiki_qa: QA)")],
             path: Annotated[str, typer.Option(help="folder holding the files (a DVC dependency)")],
             train: Annotated[str, typer.Option(help="train file in the folder")],
             fmt: Annotated[Format, typer.Option("--format", help="glue, squad, text or jsonl")] = "glue",
             task: Annotated[str | None, typer.Option(help="GLUE task (sst2, mrpc, stsb, ...); glue only")] = None,
             dev: Annotated[str | None, typer.Option(help="dev file (selects models); else carve it")] = None,
             test: Annotated[str | None, typer.Option(help="test file (the reported score), e.g. the official "
                                                           "dev.tsv")] = None,
             carve_dev: Annotated[float, typer.Option(help="fraction of train's groups carved to dev")] = 0.0,
             carve_test: Annotated[float, typer.Option(help="fraction of train's groups carved to test")] = 0.0,
             seed: Annotated[int, typer.Option(help="seed of the carve")] = 0,
             max_seq_len: Annotated[int | None, typer.Option(help="tokens per row (QA: per window); else --like's "
                                                                  "value")] = None,
             doc_stride: Annotated[int | None, typer.Option(help="QA: overlap of a context's windows, in tokens; "
                                                                 "else --like's value")] = None,
             max_query_len: Annotated[int | None, typer.Option(help="QA: question tokens kept; else --like's "
                                                                    "value")] = None,
             encoding: Annotated[str, typer.Option(help="text encoding of the files")] = "utf-8",
             budget: Annotated[float, typer.Option(help="minutes a training stage (teacher fine-tuning, each student "
                                                        "run) may take on this machine: each gets the papers' recipe "
                                                        "or what fits these minutes on the new data, from rates "
                                                        "measured now; 0 writes the recipes unfitted")] = 30.0,
             elmo: Annotated[bool, typer.Option(help="also copy the runs initialised from an ELMo language model "
                                                     "(train_lm; they add the word-vector and biLM stages)")] = False,
             dry_run: Annotated[bool, typer.Option(help="print what would be added, write nothing")] = False,
             params: ParamsOpt = Path("params.yaml")) -> None:
    """Add a task from your files: its prepare.local, tokenize, teacher, student runs, evaluate and report entries,
    copied from the dataset given by --like, with the papers' training recipes fitted to your data and --budget (it
    reads the files and measures this machine, ~10-60 s). Then `dvc repro` runs it from prepare to report."""
    if fmt == "glue" and not task:
        raise ConfigError("--format glue needs --task (sst2, mrpc, stsb, ...)")
    files = {"train": train, **({"dev": dev} if dev else {}), **({"test": test} if test else {})}
    local: dict = {"format": fmt}
    if fmt == "glue":
        local["task"] = task
    local.update(path=path, files=files)
    if fmt in ("text", "jsonl"):
        local["text_field"] = "text"
    local["encoding"] = encoding
    if fmt != "squad":
        local["on_bad_rows"] = "error"
    local["carve"] = {"dev": carve_dev, "test": carve_test, "seed": seed} if carve_dev or carve_test else None
    lengths = {k: v for k, v in (("max_seq_len", max_seq_len), ("doc_stride", doc_stride),
                                  ("max_query_len", max_query_len)) if v is not None}
    if budget < 0:
        raise ConfigError(f"--budget {budget}: give minutes a training stage (> 0), or 0 to copy the schedules")
    sizing: list[str] = []
    added = add_task(params, name, like, local, lengths=lengths, write=not dry_run, elmo=elmo,
                     budget_minutes=budget or None, report=sizing)
    typer.echo(f"{'would add' if dry_run else 'added'} to {params}:")
    for key in added:
        typer.echo(f"  {key}")
    for line in sizing:
        typer.echo(line)
    if not dry_run:
        typer.echo(f"next: `dvc repro` (or `dvc repro report`) runs {name} from prepare_local@{name} to the report")
