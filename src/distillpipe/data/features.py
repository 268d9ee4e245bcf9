"""The Arrow features of a prepared dataset, one per task type (the format in :mod:`distillpipe.data.schema`), and
rows turned into a ``Dataset`` of them.

Everything that writes a prepared dataset uses it: the sources of the ``prepare`` stage and the ``augment`` stage
(generated questions are a prepared QA dataset). A module of its own, so that ``augment`` holds none of the sources'
code (docs/code-deps.md).
"""

from __future__ import annotations

from typing import Any, Sequence

from datasets import Dataset, Features, List, Value

FEATURES: dict[str, Features] = {
    "corpus": Features({"doc_id": Value("string"), "text": Value("string")}),
    "classification_single": Features({"id": Value("string"), "text_a": Value("string"), "label": Value("int64")}),
    "classification": Features(
        {"id": Value("string"), "text_a": Value("string"), "text_b": Value("string"), "label": Value("int64")}
    ),
    "regression": Features(
        {"id": Value("string"), "text_a": Value("string"), "text_b": Value("string"), "label": Value("float32")}
    ),
    "qa": Features(
        {
            "id": Value("string"),
            "title": Value("string"),
            "context": Value("string"),
            "question": Value("string"),
            "answers": {"text": List(Value("string")), "answer_start": List(Value("int32"))},
        }
    ),
}
"""Arrow schema per task type (see ``distillpipe.data.schema``); classification without ``text_b``
is the single-sentence layout."""


def features_for(task_type: str, text_fields: Sequence[str]) -> Features:
    if task_type == "classification" and "text_b" not in text_fields:
        return FEATURES["classification_single"]
    return FEATURES[task_type]


def rows_to_dataset(rows: list[dict[str, Any]], task_type: str, text_fields: Sequence[str]) -> Dataset:
    features = features_for(task_type, text_fields)
    columns = {name: [r[name] for r in rows] for name in features}
    return Dataset.from_dict(columns, features=features)
