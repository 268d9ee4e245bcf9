"""``distillpipe evaluate``: the ``evaluate`` stage (scores only; timing is the ``speed`` stage)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from distillpipe.commands.base import LiveOpt, ParamsOpt, RunOpt, TokensOpt, entry_point, named_entry, user_errors
from distillpipe.config.base import load_section
from distillpipe.config.evaluate import EvaluateConfig
from distillpipe.evaluate.run import evaluate_run


@user_errors
def evaluate(run: RunOpt,
             student: Annotated[Path, typer.Option(help="trained student folder")],
             tokens: TokensOpt,
             prepared: Annotated[Path, typer.Option(help="prepared dataset folder (QA examples)")],
             teacher: Annotated[Path, typer.Option(help="the teacher model folder to compare with")],
             out: Annotated[Path, typer.Option(help="the full record JSON to write (for the report)")],
             predictions: Annotated[Path, typer.Option(help="per-example predictions JSON to write (for the report)")],
             live: LiveOpt,
             params: ParamsOpt = Path("params.yaml")) -> None:
    """Score a student and its teacher on dev/test and count their parameters (deterministic output)."""
    cfg = load_section(params, "evaluate", EvaluateConfig)
    rcfg = named_entry(cfg, run, params, "evaluate", "runs")
    r = evaluate_run(run, cfg, rcfg, student_dir=student, tokens_dir=tokens, prepared_dir=prepared,
                     teacher_dir=teacher, out_path=out, predictions_path=predictions, live_dir=live)
    m = r["primary_metric"]
    typer.echo(f"evaluate {run}: dev {m} {r['dev'][m]:.4f} (teacher {r['teacher']['dev'][m]:.4f}); "
               f"{r['params']['total']:,} parameters (teacher {r['teacher']['params']['total']:,})")


main = entry_point(evaluate, "evaluate")
