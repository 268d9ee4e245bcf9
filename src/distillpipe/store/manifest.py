"""The store manifest: what a teacher cache was built from, and how far its build got.

Stored as JSON in the root group's attributes under ``"manifest"``. Fields:

=====================  ==========================================================================
format_version         layout/semantics version of the store (:data:`FORMAT_VERSION`)
teacher                {name, weights_sha256, tokenizer_sha256, config (JSON object)}
tokens_fingerprint     fingerprint of the tokens dataset the rows come from
signals                the :class:`~distillpipe.store.schema.SignalSpec` as a dict
code_version           ``distillpipe.__version__`` that wrote the store
n_rows, shard_rows     N and rows per shard
completed_shards       sorted shard indices known complete (progress, not identity)
=====================  ==========================================================================

Identity vs progress: a stale cache must never be used silently, so readers and the writer compare
the *identity* fields and refuse (reader) or rebuild (writer) on any difference. Progress
(``completed_shards``) and provenance (``code_version``) are excluded: comparing the code version
would throw away hundreds of GB of teacher outputs at every release although the stored values do
not depend on it. A change to what the store means or how it is laid out must bump
:data:`FORMAT_VERSION`, which is compared.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import distillpipe
from distillpipe.store.schema import SignalSpec

FORMAT_VERSION = 1
NOT_COMPARED = ("completed_shards", "code_version")
"""Top-level manifest fields left out of identity comparisons (progress and provenance)."""
_MISSING = object()
_FIX_HINT = (
    "Re-run `dvc repro teacher_cache` to rebuild the cache for the current params and inputs "
    "(or delete {path} and re-run)."
)


@dataclass(frozen=True, kw_only=True)
class TeacherInfo:
    """The teacher whose outputs are cached."""

    name: str
    weights_sha256: str
    tokenizer_sha256: str
    config: Mapping[str, Any]
    """The teacher's model config (e.g. HF ``config.to_dict()``): must be JSON-serialisable."""

    def __post_init__(self) -> None:
        try:
            json.dumps(dict(self.config))
        except TypeError as e:
            raise ValueError(f"teacher config of {self.name!r} must be JSON-serialisable for the manifest: {e}") from e

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "weights_sha256": self.weights_sha256,
            "tokenizer_sha256": self.tokenizer_sha256,
            "config": _json_normal(dict(self.config)),
        }


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """Identity and progress of a teacher-cache store."""

    teacher: TeacherInfo
    tokens_fingerprint: str
    signals: SignalSpec
    n_rows: int
    shard_rows: int
    completed_shards: tuple[int, ...] = ()
    format_version: int = FORMAT_VERSION
    code_version: str = field(default=distillpipe.__version__)

    def __post_init__(self) -> None:
        if self.n_rows < 0 or self.shard_rows < 1:
            raise ValueError(f"manifest needs n_rows >= 0 and shard_rows >= 1, got {self.n_rows}, {self.shard_rows}")
        done = tuple(sorted({int(i) for i in self.completed_shards}))
        if done and (done[0] < 0 or done[-1] >= self.n_shards):
            raise ValueError(f"completed_shards {list(done)} out of range for {self.n_shards} shards")
        object.__setattr__(self, "completed_shards", done)

    @property
    def n_shards(self) -> int:
        return -(-self.n_rows // self.shard_rows)

    def shard_rows_range(self, i: int) -> tuple[int, int]:
        """Rows [start, stop) of shard i."""
        if not 0 <= i < self.n_shards:
            raise IndexError(f"shard {i} out of range: the store has {self.n_shards} shards")
        return i * self.shard_rows, min(self.n_rows, (i + 1) * self.shard_rows)

    @property
    def complete(self) -> bool:
        return len(self.completed_shards) == self.n_shards

    def with_completed(self, shards: object) -> Manifest:
        return replace(self, completed_shards=tuple(shards))  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, keys in a fixed order (the stored bytes depend on it)."""
        return {
            "format_version": self.format_version,
            "teacher": self.teacher.to_dict(),
            "tokens_fingerprint": self.tokens_fingerprint,
            "signals": self.signals.to_dict(),
            "code_version": self.code_version,
            "n_rows": self.n_rows,
            "shard_rows": self.shard_rows,
            "completed_shards": list(self.completed_shards),
        }

    def identity(self) -> dict[str, Any]:
        """The fields that must match for a cache to be reused."""
        return {k: v for k, v in self.to_dict().items() if k not in NOT_COMPARED}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Manifest:
        names = {"format_version", "teacher", "tokens_fingerprint", "signals", "code_version",
                 "n_rows", "shard_rows", "completed_shards"}  # fmt: skip
        unknown, missing = sorted(set(d) - names), sorted(names - set(d))
        if unknown or missing:
            raise ValueError(f"manifest: unknown keys {unknown}, missing keys {missing}")
        return cls(
            teacher=TeacherInfo(**d["teacher"]),
            tokens_fingerprint=d["tokens_fingerprint"],
            signals=SignalSpec.from_dict(d["signals"]),
            n_rows=int(d["n_rows"]),
            shard_rows=int(d["shard_rows"]),
            completed_shards=tuple(d["completed_shards"]),
            format_version=int(d["format_version"]),
            code_version=str(d["code_version"]),
        )


@dataclass(frozen=True)
class FieldDiff:
    """One differing manifest field, by dotted path (``teacher.tokenizer_sha256``)."""

    path: str
    actual: Any
    expected: Any

    def __str__(self) -> str:
        return f"{self.path}: cache has {_show(self.actual)}, expected {_show(self.expected)}"


class StoreIncomplete(RuntimeError):
    """The store exists and matches, but not every shard has been written yet."""

    def __init__(self, where: str, done: int, total: int):
        self.where, self.done, self.total = where, done, total
        super().__init__(
            f"teacher cache {where} is incomplete: {done} of {total} shards complete; "
            "run `dvc repro teacher_cache` to finish it"
        )


class ManifestMismatch(ValueError):
    """The cache on disk was built from other params or inputs than the caller expects."""

    def __init__(self, where: str, differences: list[FieldDiff]):
        self.where = where
        self.differences = differences
        lines = "\n".join(f"  - {d}" for d in differences)
        super().__init__(
            f"teacher cache {where} does not match what this run expects "
            f"({len(differences)} field(s) differ):\n{lines}\n" + _FIX_HINT.format(path=where)
        )


def diff_manifests(expected: Mapping[str, Any], actual: Mapping[str, Any], *, subset: bool) -> list[FieldDiff]:
    """Differences between two manifest dicts, nested dicts compared key by key.

    ``subset=True`` compares only the fields ``expected`` names (a reader may pin just the teacher
    and the tokens); ``subset=False`` also reports fields only ``actual`` has. Fields in
    :data:`NOT_COMPARED` are always skipped. Values are compared after a JSON round trip, so a
    tuple equals the list it is stored as.
    """
    exp = {k: v for k, v in _json_normal(dict(expected)).items() if k not in NOT_COMPARED}
    act = {k: v for k, v in _json_normal(dict(actual)).items() if k not in NOT_COMPARED}
    out: list[FieldDiff] = []
    _diff("", exp, act, subset, out)
    return out


def check_manifest(expected: Manifest | Mapping[str, Any], actual: Manifest | Mapping[str, Any], *, where: str) -> None:
    """Raise :class:`ManifestMismatch` naming every differing identity field. A :class:`Manifest`
    as ``expected`` is compared in full; a plain dict only on the fields it names."""
    subset = not isinstance(expected, Manifest)
    exp = expected.to_dict() if isinstance(expected, Manifest) else expected
    act = actual.to_dict() if isinstance(actual, Manifest) else actual
    differences = diff_manifests(exp, act, subset=subset)
    if differences:
        raise ManifestMismatch(where, differences)


def _diff(prefix: str, exp: Any, act: Any, subset: bool, out: list[FieldDiff]) -> None:
    if isinstance(exp, dict) and isinstance(act, dict):
        keys = list(exp) + ([k for k in act if k not in exp] if not subset else [])
        for k in keys:
            _diff(f"{prefix}.{k}" if prefix else str(k), exp.get(k, _MISSING), act.get(k, _MISSING), subset, out)
    elif exp != act:
        out.append(FieldDiff(prefix, act, exp))


def _json_normal(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=False))


def _show(value: Any) -> str:
    if value is _MISSING:
        return "<missing>"
    if isinstance(value, str):
        return value if len(value) <= 16 else value[:12] + "…"
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "…"
