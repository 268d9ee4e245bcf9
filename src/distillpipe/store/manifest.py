"""The store manifest: what a teacher cache was built from, and how far its build got.

Stored as JSON in the root group's attributes under ``"manifest"``. Fields:

=====================  ==========================================================================
format_version         layout/semantics version of the store (:data:`FORMAT_VERSION`)
teacher                {name, weights_sha256, tokenizer_sha256, config (JSON object)}
tokens_fingerprint     content digest of the tokens dataset the rows come from
split                  the tokens split whose rows are cached (``train``)
row_subset             only when a subset of the split is cached: {max_rows, rule}; ``row_index`` names the rows
signals                the :class:`~distillpipe.store.schema.SignalSpec` as a dict (``precision``: how each
                       quantizable signal is stored)
encoding               only when a signal is stored compressed: {array: {kind, values, scale, formula}}, the stored
                       arrays of each compressed array and the formula that decodes them (derived from ``signals``;
                       what a reader without distillpipe needs: :data:`~distillpipe.store.schema.FORMULAS`)
compact                only when a signal is stored in a compact form: {signal group: how it reconstructs from the
                       arrays and the constants} (:data:`~distillpipe.store.schema.COMPACT_FORMULAS`)
compute                how the values were computed: {precision, batch_size}; a resumed build must not
                       mix bf16-on-GPU shards with fp32-on-CPU ones, nor batchings (padding and kernel
                       choice shift the last bits)
code                   {source file: sha256} of the code that decides the bytes: the ``teacher_cache``
                       stage's whole import closure (``distillpipe.teacher.cache.producer_code``)
code_version           ``distillpipe.__version__`` that wrote the store
n_rows, shard_rows     N and rows per shard
completed_shards       sorted shard indices known complete (progress, not identity)
=====================  ==========================================================================

Identity vs progress: a stale cache must never be used silently, so the writer compares every
*identity* field and rebuilds on any difference, naming it (``code.distillpipe/pooling.py: cache
has 1a2b…, expected 3c4d…``). Progress (``completed_shards``) and provenance (``code_version``) are not
compared. Readers (student training) compare only the fields they name (teacher, tokens, split): a
store built by other code is still the teacher's outputs on those tokens, and training code differs
from the code that built it by design. A change to what the store means or how it is laid out must
bump :data:`FORMAT_VERSION`, which is compared.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import distillpipe
from distillpipe.errors import UserError
from distillpipe.identity import OLD_CODE, old_code_identity
from distillpipe.store.schema import SignalSpec

MANIFEST_KEY = "manifest"
"""Key of the manifest in the root group's attributes."""
FORMAT_VERSION = 6
"""2: crc32c per inner chunk (a damaged chunk fails its read), code and compute in the identity; 3: Blosc lz4
instead of zstd (nearly the bytes of padding zstd saved, 5-10x less CPU to write and to read); 4: a per-signal
``precision`` in the signals (compressed stored forms, the manifest's ``encoding``); 5: a codec chain per array
(per-position arrays raw in chunks of one row and a block of positions, attention maps lz4 without shuffle per
row) and markers that record a crc32c digest instead of a sha256; 6: compact signals (hidden states as coordinates
in a fitted principal subspace, pooled scores as low-rank factors, attention probabilities as top-k keys, the
embedding output derived from the teacher's tables) and the store's constants (``constants/``, checked by
``constants.json``)."""
FORMAT_CHANGE = ("format 6 stores the compact forms of hidden states, attention and embeddings (a tenth of the "
                 "bytes of a WaLDORf row) and the constants they need")
"""Why a store of the previous format is rebuilt: said when one is met."""
NOT_COMPARED = ("completed_shards", "code_version")
"""Top-level manifest fields left out of identity comparisons (progress and provenance)."""
_MISSING = object()
_FIX_HINT = (
    "Re-run `dvc repro teacher_cache` to rebuild the cache for the current params, inputs and code "
    "(or `dvc pull` the cache that matches them)."
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
    split: str
    signals: SignalSpec
    compute: Mapping[str, Any]
    """{"precision": "fp32" | "bf16-autocast", "batch_size": int}: how the values were computed."""
    code: Mapping[str, str]
    """{source file: sha256} of the code that decides the bytes."""
    n_rows: int
    shard_rows: int
    completed_shards: tuple[int, ...] = ()
    row_subset: Mapping[str, Any] | None = None
    """{"max_rows": k, "rule": "evenly_spaced"} when only k rows of the split are cached; None: every row. Left out
    of the dict when None, so stores of every row keep the identity they had before the field existed."""
    format_version: int = FORMAT_VERSION
    code_version: str = field(default=distillpipe.__version__)

    def __post_init__(self) -> None:
        if self.n_rows < 0 or self.shard_rows < 1:
            raise ValueError(f"manifest needs n_rows >= 0 and shard_rows >= 1, got {self.n_rows}, {self.shard_rows}")
        done = tuple(sorted({int(i) for i in self.completed_shards}))
        if done and (done[0] < 0 or done[-1] >= self.n_shards):
            raise ValueError(f"completed_shards {list(done)} out of range for {self.n_shards} shards")
        object.__setattr__(self, "completed_shards", done)
        object.__setattr__(self, "compute", _json_normal(dict(self.compute)))
        object.__setattr__(self, "code", dict(sorted(self.code.items())))

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
            "split": self.split,
            **({"row_subset": dict(self.row_subset)} if self.row_subset is not None else {}),
            "signals": self.signals.to_dict(),
            **({"encoding": self.encoding()} if self.signals.encodings() else {}),
            **({"compact": self.signals.compact()} if self.signals.compact() else {}),
            "compute": dict(self.compute),
            "code": dict(self.code),
            "code_version": self.code_version,
            "n_rows": self.n_rows,
            "shard_rows": self.shard_rows,
            "completed_shards": list(self.completed_shards),
        }

    def encoding(self) -> dict[str, dict[str, str]]:
        """{array: {kind, values, scale, formula}} for the arrays stored compressed (the manifest's ``encoding``)."""
        return {name: {"kind": e.kind, "values": e.values, "scale": e.scale, "formula": e.formula}
                for name, e in self.signals.encodings().items()}

    def identity(self) -> dict[str, Any]:
        """The fields that must match for a cache to be reused."""
        return {k: v for k, v in self.to_dict().items() if k not in NOT_COMPARED}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Manifest:
        names = {"format_version", "teacher", "tokens_fingerprint", "split", "signals", "compute", "code",
                 "code_version", "n_rows", "shard_rows", "completed_shards"}  # fmt: skip
        if d.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"manifest of format version {d.get('format_version')}; this distillpipe reads version "
                             f"{FORMAT_VERSION} ({FORMAT_CHANGE}): a store written by another version is rebuilt")
        unknown, missing = sorted(set(d) - names - {"row_subset", "encoding", "compact"}), sorted(names - set(d))
        if unknown or missing:
            raise ValueError(f"manifest: unknown keys {unknown}, missing keys {missing}")
        return cls(
            teacher=TeacherInfo(**d["teacher"]),
            tokens_fingerprint=d["tokens_fingerprint"],
            split=str(d["split"]),
            signals=SignalSpec.from_dict(d["signals"]),
            compute=d["compute"],
            code=d["code"],
            n_rows=int(d["n_rows"]),
            shard_rows=int(d["shard_rows"]),
            completed_shards=tuple(d["completed_shards"]),
            row_subset=d.get("row_subset"),
            format_version=int(d["format_version"]),
            code_version=str(d["code_version"]),
        )


@dataclass(frozen=True)
class FieldDiff:
    """One differing manifest field, by dotted path (``teacher.tokenizer_sha256``)."""

    path: str
    actual: Any
    expected: Any
    why: str | None = None
    """Said instead of the two values where they would not tell what differs (code identified another way)."""

    def __str__(self) -> str:
        if self.why:
            return f"{self.path}: {self.why}"
        return f"{self.path}: cache has {_show(self.actual)}, expected {_show(self.expected)}"


class StoreIncomplete(UserError, RuntimeError):
    """The store exists and matches, but not every shard has been written yet."""

    def __init__(self, where: str, done: int, total: int):
        self.where, self.done, self.total = where, done, total
        super().__init__(
            f"teacher cache {where} is incomplete: {done} of {total} shards complete; "
            "run `dvc repro teacher_cache` to finish it"
        )


class StoreDamaged(UserError, RuntimeError):
    """Files of completed shards are missing, truncated or altered: the cache on disk is not what was built.

    One message argument, so that a DataLoader worker's exception re-raises as this class."""

    @classmethod
    def of_shards(cls, where: str, problems: Mapping[int | str, list[str]]) -> StoreDamaged:
        """``problems``: {shard index, or ``"constants"`` for the store's constants: what is wrong}."""
        items = sorted(problems.items(), key=lambda kv: (isinstance(kv[0], int), kv[0]))
        lines = "\n".join(f"  - {f'shard {i}' if isinstance(i, int) else i}: {'; '.join(p)}" for i, p in items[:20])
        more = f"\n  (and {len(problems) - 20} more shards)" if len(problems) > 20 else ""
        shards = sum(isinstance(i, int) for i in problems)
        parts = [f"{shards} shard(s)"] * bool(shards) + [str(i) for i in problems if not isinstance(i, int)]
        return cls(f"teacher cache {where} is damaged ({' and '.join(parts)}):\n{lines}{more}\n" + DAMAGE_FIX.format(
            path=where))


DAMAGE_FIX = ("Restore it with `dvc checkout --force {path}` (`dvc pull --force {path}` when the DVC cache lacks it; "
              "without --force DVC refuses to overwrite a changed file), or recompute the damaged shards with "
              "`dvc repro teacher_cache` (the stage checks every shard and redoes the bad ones).")


class ManifestMismatch(UserError, ValueError):
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
    if "code" in exp and exp["code"] != act.get("code") and old_code_identity(act.get("code")):
        # every file would differ: say why, once
        out.append(FieldDiff("code", act["code"], exp["code"], why=OLD_CODE))
        exp, act = {k: v for k, v in exp.items() if k != "code"}, {k: v for k, v in act.items() if k != "code"}
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
