"""The papers' training recipes that ``distillpipe new-task`` starts a new task from, before fitting them to
``--budget`` (:mod:`distillpipe.train.sizing`).

The embedded params.yaml is sized for minutes of a 2-core CPU (a teacher on 448 rows for 28 steps, students of
40-96 steps): copied onto a user's data as they are, they train a teacher on a sliver of it and call that the
teacher. So a new task's schedules start from these recipes, and the budget then cuts what does not fit.

**Teacher** (BERT fine-tuning: Devlin et al. 2019, sec. 4.1-4.3 and appendix A.3): every train row, batch 32,
AdamW at 5e-5 (the top of BERT's grid {5e-5, 3e-5, 2e-5}: a small teacher such as MiniLM-L6 learns slowly at its
bottom), linear decay after a 10% warm-up, weight decay 0.01; 3 epochs for classification and regression (the
grid's {2, 3, 4}), 2 for extractive QA (SQuAD v2.0, sec. 4.3).

**Students**, by the paper of their architecture (keys of a run's ``optim``; what is not named is copied):

* ``cmow_hybrid`` fine-tuning: 20 epochs with early stopping after 5 epochs without a better dev score (CMOW paper,
  sec. IV-A; the paper grid-searches the learning rate, so the copied one stays);
* ``minialbert`` fine-tuning: at most 10 epochs at 5e-5 (``tune: full``), 15 at 5e-4 (``tune: adapters``) (MiniALBERT
  paper, sec. 4 and Tables 7-8; 5 and 10 on its large datasets, which a budget cuts to anyway);
* ``waldorf`` trained on the task: 35 epochs at 2e-4, batch 24 (WaLDORf paper, Table 5);
* any other run (general distillation, ELMo heads on frozen features): its copied schedule without a step cap.

Every recipe drops the copied ``max_steps`` (an embedded CPU cap), so that a run is bounded by its epochs and the
budget only.
"""

from __future__ import annotations

from typing import Any

__all__ = ["student_recipe", "teacher_recipe"]

_TEACHER = {"batch_size": 32, "lr": 5.0e-5, "weight_decay": 0.01, "warmup_fraction": 0.1, "max_train_rows": None}
_STUDENTS: dict[tuple[str, str, str | None], dict[str, Any]] = {
    ("finetune", "cmow_hybrid", None): {"epochs": 20, "patience": 5, "eval_every": 0},
    ("finetune", "minialbert", "full"): {"epochs": 10, "lr": 5.0e-5, "eval_every": 0},
    ("finetune", "minialbert", "adapters"): {"epochs": 15, "lr": 5.0e-4, "eval_every": 0},
    ("train", "waldorf", None): {"epochs": 35, "lr": 2.0e-4, "batch_size": 24},
}


def teacher_recipe(task_type: str) -> dict[str, Any]:
    """The ``teacher_finetune.tasks`` keys of BERT's fine-tuning recipe for ``task_type`` (classification,
    regression, qa)."""
    return {"epochs": 2 if task_type == "qa" else 3, **_TEACHER}


def student_recipe(section: str, student: str, tune: str | None) -> tuple[dict[str, Any], str]:
    """``(optim keys, where they come from)`` of a ``section`` (train, finetune) run of ``student``."""
    keys = _STUDENTS.get((section, student, tune)) or _STUDENTS.get((section, student, None))
    if keys is None:
        return {"max_steps": None}, "its copied schedule without a step cap"
    source = {"cmow_hybrid": "CMOW paper sec. IV-A", "minialbert": "MiniALBERT paper Tables 7-8",
              "waldorf": "WaLDORf paper Table 5"}[student]
    return {**keys, "max_steps": None}, source
