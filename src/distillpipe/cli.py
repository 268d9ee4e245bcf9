"""The ``distillpipe`` command: every pipeline stage as a subcommand, plus inspection tools.

Each command lives in its own module under :mod:`distillpipe.commands` (the DVC stage scripts run those
modules alone); this module only gathers them. Errors a user can fix exit with status 2 and one message.
"""

from __future__ import annotations

import typer

from distillpipe.commands import (
    augment,
    dvc_deps,
    embedded_results,
    evaluate,
    export,
    finetune,
    fingerprint,
    inspect,
    new_task,
    params_style,
    plan,
    predict,
    prepare,
    qg_finetune,
    report,
    speed,
    teacher_cache,
    teacher_finetune,
    teacher_import,
    tokenize,
    train,
    train_aug,
    train_lm,
    word_vectors,
)
from distillpipe.commands.base import keep_freed_memory

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n\n")[0])
for name, fn in [
    ("prepare", prepare.prepare),
    ("tokenize", tokenize.tokenize),
    ("teacher-import", teacher_import.teacher_import),
    ("teacher-finetune", teacher_finetune.teacher_finetune),
    ("teacher-cache", teacher_cache.teacher_cache),
    ("qg-finetune", qg_finetune.qg_finetune),
    ("augment", augment.augment),
    ("train", train.train),
    ("word-vectors", word_vectors.word_vectors),
    ("train-aug", train_aug.train_aug),
    ("train-lm", train_lm.train_lm),
    ("finetune", finetune.finetune),
    ("evaluate", evaluate.evaluate),
    ("speed", speed.speed),
    ("report", report.report),
    ("inspect", inspect.inspect),
    ("plan", plan.plan),
    ("new-task", new_task.new_task),
    ("export", export.export),
    ("predict", predict.predict),
    ("fingerprint", fingerprint.fingerprint),
    ("dvc-deps", dvc_deps.dvc_deps),
    ("params-style", params_style.params_style),
    ("embedded-results", embedded_results.embedded_results),
]:
    app.command(name)(fn)


def main() -> None:  # pragma: no cover - console entry point
    keep_freed_memory()
    app(prog_name="distillpipe")


if __name__ == "__main__":  # pragma: no cover - `python -m distillpipe.cli`
    main()
