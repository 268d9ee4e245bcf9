"""The ``distillpipe`` command: every pipeline stage as a subcommand, plus inspection tools.

Each stage command loads its ``params.yaml`` section, calls one library function and prints a
one-line summary. This is the only place that turns exceptions into exit codes: errors a user
can fix (bad params, bad input files, a stale cache) print a message and exit 2; set
``DISTILLPIPE_DEBUG=1`` to see the traceback.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Callable

import typer

from distillpipe.assets import AssetError
from distillpipe.config import ConfigError, load_section

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n\n")[0])
log = logging.getLogger("distillpipe")

# Errors whose message is the whole story for a user; anything else is a bug and keeps its traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (ConfigError, AssetError, FileNotFoundError)

ParamsOpt = Annotated[Path, typer.Option("--params", help="params.yaml to read the stage's section from")]
DatasetOpt = Annotated[str, typer.Option("--dataset", help="dataset name (a key of the stage's `datasets`)")]


def _setup_logging() -> None:
    level = os.environ.get("DISTILLPIPE_LOG", "INFO").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "urllib3", "filelock", "fsspec"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def user_errors(fn: Callable) -> Callable:
    """Run a command; print user-fixable errors as one clear message and exit 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _setup_logging()
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS + _extra_user_errors() as e:
            if os.environ.get("DISTILLPIPE_DEBUG"):
                raise
            typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None

    return wrapper


def _extra_user_errors() -> tuple[type[BaseException], ...]:
    """User-facing error classes of the heavier modules, imported only when a command runs."""
    from distillpipe.data.prepare import PrepareError
    from distillpipe.data.tokenize import TokenizeError
    from distillpipe.store import ManifestMismatch, StoreIncomplete
    from distillpipe.teacher.cache import TeacherCacheError
    from distillpipe.teacher.finetune import FinetuneError

    return (PrepareError, TokenizeError, FinetuneError, TeacherCacheError, ManifestMismatch, StoreIncomplete)


def _dataset_cfg(section, name: str, params: Path, section_name: str):
    if name not in section.datasets:
        raise ConfigError(f"{params}: {section_name}.datasets has no dataset {name!r}; known: {sorted(section.datasets)}")
    return section.datasets[name]


@app.command()
@user_errors
def prepare(dataset: DatasetOpt, out: Annotated[Path, typer.Option(help="output folder")],
            params: ParamsOpt = Path("params.yaml")) -> None:
    """Read a dataset from its source (embedded, local files, hub) into data/prepared/<dataset>/."""
    from distillpipe.data.prepare import prepare_dataset

    cfg = _dataset_cfg(load_section("prepare", params), dataset, params, "prepare")
    summary = prepare_dataset(dataset, cfg, out)
    typer.echo(summary.one_line())


@app.command()
@user_errors
def tokenize(dataset: DatasetOpt,
             prepared: Annotated[Path, typer.Option(help="prepared dataset folder")],
             out: Annotated[Path, typer.Option(help="output folder")],
             params: ParamsOpt = Path("params.yaml")) -> None:
    """Tokenize a prepared dataset with the teacher's tokenizer into data/tokens/<dataset>/."""
    from distillpipe.data.tokenize import tokenize_dataset

    cfg = load_section("tokenize", params)
    _dataset_cfg(cfg, dataset, params, "tokenize")
    summary = tokenize_dataset(dataset, prepared, cfg, out)
    typer.echo(summary.one_line())


@app.command("teacher-import")
@user_errors
def teacher_import(name: Annotated[str, typer.Option(help="a key of teacher_import.models")],
                   out: Annotated[Path, typer.Option(help="output folder (models/teacher/<name>)")],
                   params: ParamsOpt = Path("params.yaml")) -> None:
    """Save a teacher (embedded, local or hub) into a DVC-tracked model folder."""
    from distillpipe.teacher.finetune import import_teacher

    cfg = load_section("teacher_import", params)
    if name not in cfg.models:
        raise ConfigError(f"{params}: teacher_import.models has no {name!r}; known: {sorted(cfg.models)}")
    typer.echo(import_teacher(cfg.models[name], out))


@app.command("teacher-finetune")
@user_errors
def teacher_finetune(task: Annotated[str, typer.Option(help="a key of teacher_finetune.tasks")],
                     base: Annotated[Path, typer.Option(help="base teacher folder")],
                     tokens: Annotated[Path, typer.Option(help="tokenized task folder")],
                     prepared: Annotated[Path, typer.Option(help="prepared task folder (QA contexts for dev EM/F1)")],
                     out: Annotated[Path, typer.Option(help="output model folder")],
                     checkpoints: Annotated[Path, typer.Option(help="checkpoint folder (resume: auto)")],
                     metrics: Annotated[Path, typer.Option(help="dev metrics JSON to write")],
                     params: ParamsOpt = Path("params.yaml")) -> None:
    """Fine-tune the teacher on a task; resumes from its checkpoints; writes the model and dev metrics."""
    from distillpipe.teacher.finetune import finetune_teacher

    cfg = load_section("teacher_finetune", params)
    if task not in cfg.tasks:
        raise ConfigError(f"{params}: teacher_finetune.tasks has no {task!r}; known: {sorted(cfg.tasks)}")
    summary = finetune_teacher(task, base, tokens, prepared, cfg.tasks[task], cfg.device, out, checkpoints,
                               metrics)
    typer.echo(summary.one_line())


@app.command("teacher-cache")
@user_errors
def teacher_cache(dataset: DatasetOpt,
                  tokens: Annotated[Path, typer.Option(help="tokens folder")],
                  teacher: Annotated[Path, typer.Option(help="teacher model folder")],
                  out: Annotated[Path, typer.Option(help="Zarr store to create or resume")],
                  params: ParamsOpt = Path("params.yaml")) -> None:
    """Run the teacher over a tokens split and cache its signals in a sharded, resumable Zarr store."""
    from distillpipe.teacher.cache import build_teacher_cache

    cfg = load_section("teacher_cache", params)
    dcfg = _dataset_cfg(cfg, dataset, params, "teacher_cache")
    summary = build_teacher_cache(dataset, tokens, teacher, dcfg, cfg.device, cfg.batch_size, cfg.shard_rows, out)
    typer.echo(summary.one_line())


@app.command()
@user_errors
def inspect(store: Annotated[Path, typer.Argument(help="a teacher-cache store (data/teacher/<dataset>.zarr)")],
            verify: Annotated[bool, typer.Option(help="also check every shard file against its checksum")] = False) -> None:
    """Show a teacher cache: manifest, arrays, shapes, dtypes, shards, bytes per row, compression."""
    from distillpipe.store import format_info, open_store

    st = open_store(store, allow_incomplete=True)
    typer.echo(format_info(st.info()))
    if verify:
        bad = st.verify(checksum=True)
        if bad:
            for i, problems in sorted(bad.items()):
                typer.secho(f"shard {i}: {'; '.join(problems)}", fg=typer.colors.RED)
            raise typer.Exit(1)
        typer.echo("verify: every completed shard matches its checksums")


def main() -> None:  # pragma: no cover - console entry point
    app(prog_name="distillpipe")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
