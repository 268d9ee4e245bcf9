"""The ``teacher_import`` section: the base teachers, saved as DVC-tracked model folders."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TeacherImportConfig:
    models: dict[str, str]
    """name -> model spec (``embedded:minilm-l6``, a local directory or a hub name); each is saved
    to ``models/teacher/<name>/`` so every machine of a team uses byte-identical teacher weights."""
