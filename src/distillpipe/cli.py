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
    from distillpipe.qg import QgError
    from distillpipe.store import ManifestMismatch, StoreIncomplete
    from distillpipe.teacher.cache import TeacherCacheError
    from distillpipe.teacher.finetune import FinetuneError
    from distillpipe.train.data import TrainDataError
    from distillpipe.train.objective import ObjectiveError

    return (PrepareError, TokenizeError, FinetuneError, TeacherCacheError, ManifestMismatch, StoreIncomplete,
            TrainDataError, ObjectiveError, QgError)


def _dataset_cfg(section, name: str, params: Path, section_name: str):
    if name not in section.datasets:
        raise ConfigError(f"{params}: {section_name}.datasets has no dataset {name!r}; "
                          f"known: {sorted(section.datasets)}")
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
                     checkpoints: CheckpointsOpt,
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


@app.command("qg-finetune")
@user_errors
def qg_finetune(prepared: Annotated[Path, typer.Option(help="prepared QA set (its answerable train/dev rows)")],
                out: Annotated[Path, typer.Option(help="output model folder (models/qg)")],
                checkpoints: CheckpointsOpt,
                metrics: Annotated[Path, typer.Option(help="dev metrics JSON to write")],
                params: ParamsOpt = Path("params.yaml")) -> None:
    """Fine-tune T5 for question generation (context -> question); resumes from its checkpoints."""
    from distillpipe.qg.finetune import finetune_qg

    summary = finetune_qg(prepared, load_section("qg_finetune", params), out, checkpoints, metrics)
    typer.echo(summary.one_line())


@app.command()
@user_errors
def augment(name: Annotated[str, typer.Option(help="name of the augmented dataset (its meta.json and row ids)")],
            corpus: Annotated[Path, typer.Option(help="prepared corpus to take paragraphs from")],
            qg: Annotated[Path, typer.Option(help="question generator (qg_finetune's output)")],
            out: Annotated[Path, typer.Option(help="output folder: an unlabeled prepared QA dataset")],
            chunks: Annotated[Path, typer.Option(help="chunk folder (resume: auto; cleared on success)")],
            exclude: Annotated[Path | None, typer.Option(help="prepared QA set whose contexts (and articles of "
                                                         "augment.exclude_article_splits) are left out")] = None,
            params: ParamsOpt = Path("params.yaml")) -> None:
    """Generate questions for unlabeled paragraphs (chunked, resumable) into a prepared QA dataset."""
    from distillpipe.qg.augment import augment as run_augment

    summary = run_augment(name, corpus, exclude, qg, load_section("augment", params), out, chunks)
    typer.echo(summary.one_line())


RunOpt = Annotated[str, typer.Option("--run", help="run name (a key of the section's `runs`)")]
TokensOpt = Annotated[Path, typer.Option("--tokens", help="tokens folder of the run's dataset")]
CacheOpt = Annotated[Path, typer.Option("--teacher-cache", help="teacher-cache store of the run's dataset")]
PreparedOpt = Annotated[Path, typer.Option("--prepared", help="prepared dataset folder (QA contexts for dev EM/F1)")]
StudentOutOpt = Annotated[Path, typer.Option("--out", help="output student folder")]
CheckpointsOpt = Annotated[Path, typer.Option("--checkpoints", help="checkpoint folder (resume: auto)")]
TrainMetricsOpt = Annotated[Path, typer.Option("--metrics", help="training metrics JSON to write")]
PlotsOpt = Annotated[Path, typer.Option("--plots", help="folder for per-step and per-evaluation CSVs (dvc plots)")]


def _run_cfg(section, name: str, params: Path, section_name: str):
    if name not in section.runs:
        raise ConfigError(f"{params}: {section_name}.runs has no run {name!r}; known: {sorted(section.runs)}")
    return section.runs[name]


def _check_dataset(tokens: Path, dataset: str, where: str) -> None:
    from distillpipe.data.schema import read_meta

    found = read_meta(tokens).get("name")
    if found != dataset:
        raise ConfigError(f"{where}.dataset is {dataset!r} but {tokens} holds {found!r}")


@app.command()
@user_errors
def train(run: RunOpt,
          tokens: TokensOpt,
          teacher_cache: CacheOpt,
          prepared: PreparedOpt,
          out: StudentOutOpt,
          checkpoints: CheckpointsOpt,
          metrics: TrainMetricsOpt,
          plots: PlotsOpt,
          params: ParamsOpt = Path("params.yaml")) -> None:
    """Train a student from random initialisation against a teacher cache (general or task distillation)."""
    from distillpipe.train.loop import train_student

    cfg = load_section("train", params)
    rcfg = _run_cfg(cfg, run, params, "train")
    _check_dataset(tokens, rcfg.dataset, f"train.runs.{run}")
    summary = train_student(run, model_cfg=rcfg.model, run=rcfg, loader_cfg=cfg.loader, device=cfg.device,
                            tokens_dir=tokens, store_path=teacher_cache, prepared_dir=prepared, out_dir=out,
                            ckpt_dir=checkpoints, metrics_path=metrics, plots_dir=plots)
    typer.echo(summary.one_line())


@app.command("train-aug")
@user_errors
def train_aug(run: RunOpt,
              tokens: TokensOpt,
              teacher_cache: CacheOpt,
              augment_tokens: Annotated[Path, typer.Option(help="tokens folder of the augmented (unlabeled) rows")],
              augment_cache: Annotated[Path, typer.Option(help="teacher-cache store of the augmented rows")],
              prepared: PreparedOpt,
              out: StudentOutOpt,
              checkpoints: CheckpointsOpt,
              metrics: TrainMetricsOpt,
              plots: PlotsOpt,
              params: ParamsOpt = Path("params.yaml")) -> None:
    """Train a student from random initialisation on a dataset plus augmented unlabeled rows (teacher losses)."""
    from distillpipe.train.loop import train_student

    cfg = load_section("train_aug", params)
    rcfg = _run_cfg(cfg, run, params, "train_aug")
    _check_dataset(tokens, rcfg.dataset, f"train_aug.runs.{run}")
    _check_dataset(augment_tokens, rcfg.augment, f"train_aug.runs.{run}.augment: the")
    summary = train_student(run, model_cfg=rcfg.model, run=rcfg, loader_cfg=cfg.loader, device=cfg.device,
                            tokens_dir=tokens, store_path=teacher_cache, prepared_dir=prepared, out_dir=out,
                            ckpt_dir=checkpoints, metrics_path=metrics, plots_dir=plots,
                            augment=(rcfg.augment, augment_tokens, augment_cache))
    typer.echo(summary.one_line())


@app.command()
@user_errors
def finetune(run: RunOpt,
             init: Annotated[Path, typer.Option(help="the trained student (a `train` run) to start from")],
             tokens: TokensOpt,
             teacher_cache: CacheOpt,
             prepared: PreparedOpt,
             out: StudentOutOpt,
             checkpoints: CheckpointsOpt,
             metrics: TrainMetricsOpt,
             plots: PlotsOpt,
             params: ParamsOpt = Path("params.yaml")) -> None:
    """Fine-tune a trained student's encoder on a task with a fresh head (task-specific distillation)."""
    import torch

    from distillpipe.students import load_student
    from distillpipe.train.loop import train_student

    cfg = load_section("finetune", params)
    rcfg = _run_cfg(cfg, run, params, "finetune")
    _check_dataset(tokens, rcfg.dataset, f"finetune.runs.{run}")
    _, record = load_student(init, torch.device("cpu"))
    if record["name"] != rcfg.init:
        raise ConfigError(f"finetune.runs.{run}.init is {rcfg.init!r} but {init} holds the student {record['name']!r}")
    summary = train_student(run, model_cfg=record["model"], run=rcfg, loader_cfg=cfg.loader, device=cfg.device,
                            tokens_dir=tokens, store_path=teacher_cache, prepared_dir=prepared, out_dir=out,
                            ckpt_dir=checkpoints, metrics_path=metrics, plots_dir=plots, init_dir=init)
    typer.echo(summary.one_line())


@app.command()
@user_errors
def evaluate(run: RunOpt,
             student: Annotated[Path, typer.Option(help="trained student folder")],
             tokens: TokensOpt,
             prepared: Annotated[Path, typer.Option(help="prepared dataset folder (QA examples)")],
             teacher: Annotated[Path, typer.Option(help="the teacher model folder to compare with")],
             out: Annotated[Path, typer.Option(help="metrics JSON to write")],
             params: ParamsOpt = Path("params.yaml")) -> None:
    """Score a student and its teacher on dev/test, count parameters, time both in the same run."""
    from distillpipe.evaluate.run import evaluate_run

    cfg = load_section("evaluate", params)
    rcfg = _run_cfg(cfg, run, params, "evaluate")
    r = evaluate_run(run, cfg, rcfg, student_dir=student, tokens_dir=tokens, prepared_dir=prepared,
                     teacher_dir=teacher, out_path=out)
    m = r["primary_metric"]
    typer.echo(f"evaluate {run}: dev {m} {r['dev'][m]:.4f} (teacher {r['teacher']['dev'][m]:.4f}); "
               f"{r['speed']['student_sentences_per_s']:,.0f} vs {r['speed']['teacher_sentences_per_s']:,.0f} "
               f"sentences/s ({r['speed']['speedup']:.1f}x)")


@app.command()
@user_errors
def report(metrics: Annotated[Path, typer.Option(help="folder of per-run metrics JSONs (evaluate's outputs)")],
           out: Annotated[Path, typer.Option(help="Markdown report to write")],
           plot: Annotated[Path, typer.Option(help="speed-vs-quality PNG to write")],
           params: ParamsOpt = Path("params.yaml")) -> None:
    """Collect every evaluated run into reports/results.md and a speed-vs-quality plot."""
    from distillpipe.evaluate.report import write_report

    cfg = load_section("report", params)
    typer.echo(write_report(metrics, cfg, out, plot))


@app.command()
@user_errors
def inspect(store: Annotated[Path, typer.Argument(help="a teacher-cache store (data/teacher/<dataset>.zarr)")],
            verify: Annotated[bool, typer.Option(help="also check every shard file against its checksum")] = False,
            ) -> None:
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
