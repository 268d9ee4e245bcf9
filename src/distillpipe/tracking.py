"""dvclive output of the teacher, training and evaluation stages: what ``dvc exp show``, ``dvc metrics`` and
``dvc plots`` read.

Each stage item writes one folder, ``live/<kind>/<name>/``, in dvclive's layout::

    metrics.json                 the summary: ONE schema per kind of stage, the headline metric first
    params.yaml                  the item's configuration, as the stage read it
    plots/metrics/<group>/<name>.tsv   one curve per logged value (columns step, <name>), x = step

The summaries are small on purpose: every key of every metrics file is a column of ``dvc exp show``.

* teacher (``teacher_finetune``): ``dev``, ``test`` (the task's headline metric), ``metric`` (its name),
  ``step`` (optimizer steps); curves ``train/loss``, ``train/lr``;
* train (``train``, ``train_aug``, ``finetune``, ``train_lm``): ``dev`` (the best dev score), ``metric``,
  ``best_step``, ``step``; curves ``train/loss``, ``train/lr``, ``train/temperature``, ``train/<term>`` for each
  loss term, ``dev/<metric>`` for each dev metric at each evaluation;
* evaluation (``evaluate``): ``test``, ``dev`` (the student), ``teacher_test``, ``teacher_dev``, ``metric``,
  ``params`` (the student's parameter count). The full record stays the evaluate stage's own JSON.

A split that was not scored has no key. The item's ``params.yaml`` is not declared as DVC params: params.yaml
already is, and ``dvc exp show`` would show each value twice.

Everything is written once, when the stage ends, from the histories the stages keep in their checkpoints;
nothing is appended while training. A killed and resumed run therefore writes the same bytes as a straight
one (an appending writer would repeat the steps between the last checkpoint and the kill).

No side effects beyond the folder: the dvclive object is built without its DVC/git integration (it would
open the repository, ``dvc init`` a git repository that has no ``.dvc``, name an experiment and leave
signal files in ``.dvc/tmp``) and without Studio (nothing is posted, whatever token the environment holds).
Stages run under ``dvc repro`` and ``dvc exp run``, which own git and DVC.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def write_live(folder: str | Path, *, summary: Mapping[str, Any], params: Mapping[str, Any] | None = None,
               curves: Iterable[tuple[int, Mapping[str, float]]] = (), step: int | None = None) -> Path:
    """Write one dvclive folder from scratch: ``params`` (params.yaml), ``curves`` ((step, {name: value}) in
    step order, one .tsv per name) and ``summary`` (metrics.json, keys in the given order, then ``step`` when
    given). Returns the folder."""
    folder = Path(folder)
    live = _local_live()(dir=str(folder), resume=False, report=None, save_dvc_exp=False, dvcyaml=None,
                      monitor_system=False)
    if params is not None:
        live.log_params(json.loads(json.dumps(params, default=_plain)))  # plain YAML types only
    last = -1
    for at, values in curves:
        if at < last:
            raise ValueError(f"curves must come in step order: step {at} after {last}")
        last = at
        live.step = at
        for name, value in values.items():
            live.log_metric(name, _number(value))
    live.summary = {k: _number(v) for k, v in summary.items()}  # the last curve values are not the summary
    if step is not None:
        live.step = step  # make_summary adds it as "step" (after the last curve's step, if any, otherwise)
    live.make_summary()
    return folder


def teacher_summary(metric: str, dev: Mapping[str, float], test: Mapping[str, float] | None) -> dict[str, Any]:
    """The teacher schema without ``step`` (write_live adds it): headline dev, test, the metric's name."""
    out: dict[str, Any] = {"dev": dev[metric]}
    if test:
        out["test"] = test[metric]
    out["metric"] = metric
    return out


def train_summary(metric: str, best: Mapping[str, float] | None, best_step: int) -> dict[str, Any]:
    """The training schema without ``step``: the best dev score, the metric's name, the step it was reached."""
    out: dict[str, Any] = {"dev": best[metric]} if best else {}
    return {**out, "metric": metric, "best_step": best_step}


def evaluation_summary(metric: str, student: Mapping[str, Mapping[str, float] | None],
                       teacher: Mapping[str, Mapping[str, float] | None], params: int) -> dict[str, Any]:
    """The evaluation schema: ``student``/``teacher`` map a split to its scores (None: not scored)."""
    out: dict[str, Any] = {}
    for prefix, scores in (("", student), ("teacher_", teacher)):
        for split in ("test", "dev"):
            if scores.get(split):
                out[prefix + split] = scores[split][metric]
    return {**out, "metric": metric, "params": params}


def _local_live() -> type:
    """dvclive's writer without its repository and Studio hooks (see the module docstring). Imported here: dvclive
    imports DVC (~1.5 s), which only the stages that write a folder should pay for, not every command."""
    from dvclive import Live

    class LocalLive(Live):
        def _init_dvc(self) -> None:
            self._dvc_repo = None

        def _init_studio(self) -> None:
            self._dvc_studio_config = {}
            self._studio_events_to_skip.update({"start", "data", "done"})

    return LocalLive


def _number(value: Any) -> Any:
    """JSON-safe: numpy scalars to Python, non-finite floats to strings (as dvclive's log_metric does)."""
    value = _plain(value) if not isinstance(value, (str, int, float, bool)) else value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _plain(x: Any) -> Any:
    if hasattr(x, "item") and callable(x.item):  # numpy and torch scalars
        return x.item()
    if isinstance(x, tuple):
        return list(x)
    raise TypeError(f"not a plain value: {type(x)}")
