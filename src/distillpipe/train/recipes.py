"""The papers' training recipes that ``distillpipe new-task`` starts a new task from, before fitting them to
``--budget`` (:mod:`distillpipe.train.sizing`).

The embedded params.yaml is sized for minutes of a 2-core CPU (a teacher on 640 rows for 40 steps, students of
12-64 steps): copied onto a user's data as they are, they train a teacher on a sliver of it and call that the
teacher. So a new task's schedules start from these recipes, and the budget then cuts what does not fit.

**Teacher** (BERT fine-tuning: Devlin et al. 2019, sec. 4.1-4.3 and appendix A.3): every train row, for at least
BERT's 3 epochs (2 for extractive QA, SQuAD v2.0 sec. 4.3), or the copied task's epochs where it has more. The
learning rate is chosen on dev, as BERT's recipe does (sec. 4.1): among the copied task's rate and BERT's grid
{5e-5, 3e-5, 2e-5} (``lr_grid``; teacher_finetune keeps the best on dev, so the budget is shared by the rates).
Neither alone is right for every teacher and data: measured on the GLUE samples (2 cores, 2026-11-28), the embedded
MiniLM-L6 at BERT's 5e-5 and batch 32 reached dev Pearson 0.838 on STS-B and accuracy 0.789 on SST-2; at the copied
3e-4 / batch 32 (wiki_pairs) and 1e-4 / batch 16, 5 epochs (polarity): 0.877 and 0.875; on the full STS-B train,
3e-4 gave 0.611 on the GLUE dev (issue 44). Batch size, warm-up and weight decay stay the copied task's.

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

__all__ = ["BERT_LRS", "student_recipe", "teacher_recipe"]

BERT_LRS = (5.0e-5, 3.0e-5, 2.0e-5)
"""BERT's fine-tuning learning rates, the best on dev chosen (Devlin et al. 2019, sec. 4.1 and appendix A.3)."""

_STUDENTS: dict[tuple[str, str, str | None], dict[str, Any]] = {
    ("finetune", "cmow_hybrid", None): {"epochs": 20, "patience": 5, "eval_every": 0},
    ("finetune", "minialbert", "full"): {"epochs": 10, "lr": 5.0e-5, "eval_every": 0},
    ("finetune", "minialbert", "adapters"): {"epochs": 15, "lr": 5.0e-4, "eval_every": 0},
    ("train", "waldorf", None): {"epochs": 35, "lr": 2.0e-4, "batch_size": 24},
}


def teacher_recipe(task_type: str, copied: dict[str, Any]) -> dict[str, Any]:
    """The ``teacher_finetune.tasks`` keys to change in the ``copied`` entry for a ``task_type`` (classification,
    regression, qa) teacher: every row, at least BERT's epochs, and BERT's learning rates to choose from on dev
    beside the copied one."""
    return {"epochs": max(copied["epochs"], 2 if task_type == "qa" else 3), "max_train_rows": None,
            "lr_grid": [r for r in BERT_LRS if r != copied["lr"]]}


def student_recipe(section: str, student: str, tune: str | None) -> tuple[dict[str, Any], str]:
    """``(optim keys, where they come from)`` of a ``section`` (train, finetune) run of ``student``."""
    keys = _STUDENTS.get((section, student, tune)) or _STUDENTS.get((section, student, None))
    if keys is None:
        return {"max_steps": None}, "its copied schedule without a step cap"
    source = {"cmow_hybrid": "CMOW paper sec. IV-A", "minialbert": "MiniALBERT paper Tables 7-8",
              "waldorf": "WaLDORf paper Table 5"}[student]
    return {**keys, "max_steps": None}, source
