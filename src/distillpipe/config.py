"""Typed pipeline configuration: one frozen dataclass per ``params.yaml`` section.

``params.yaml`` is the single source of every pipeline parameter: no field here has a default.
:func:`load_section` reads one section and builds its dataclass recursively, failing with the
key path and the file named when a key is unknown, missing or of the wrong type.

Supported field types: ``int``, ``float``, ``str``, ``bool``, ``Literal[...]``, ``X | None``,
``list[X]``, ``dict[str, X]``, nested dataclasses, and unions of dataclasses told apart by
their ``Literal`` tag fields (``source``, ``asset``, ``format``, ``kind``), a tagged union.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

import yaml


class ConfigError(ValueError):
    """A params.yaml value is missing, unknown or of the wrong type."""


# --------------------------------------------------------------------------------------------
# prepare: where each dataset comes from
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitFractions:
    dev: float
    """Fraction of the unit of splitting (article, sentence) that goes to ``dev``."""
    test: float
    """Fraction that goes to ``test``; the rest is ``train``."""

    def __post_init__(self) -> None:
        if not (0 <= self.dev < 1 and 0 <= self.test < 1 and self.dev + self.test < 1):
            raise ConfigError(f"split fractions dev={self.dev}, test={self.test} must be >= 0 and sum to < 1")


@dataclass(frozen=True)
class EmbeddedWikiConfig:
    """gensim's bundled English Wikipedia sample as an MLM corpus, split by article."""

    source: Literal["embedded"]
    asset: Literal["wiki"]
    min_paragraph_chars: int
    """Paragraphs shorter than this (after markup removal) are dropped and counted."""
    splits: SplitFractions
    seed: int


@dataclass(frozen=True)
class EmbeddedPolarityConfig:
    """gensim's 200 Pang & Lee polarity sentences (fastText ``__label__`` format)."""

    source: Literal["embedded"]
    asset: Literal["polarity"]
    encoding: str
    """The file is cp1252; another value shows what happens with the wrong one."""
    splits: SplitFractions
    seed: int


@dataclass(frozen=True)
class EmbeddedWikiPairsConfig:
    """Paragraph pairs from the Wikipedia sample: same article or not (balanced), split by article."""

    source: Literal["embedded"]
    asset: Literal["wiki_pairs"]
    min_paragraph_chars: int
    pairs_per_article: int
    """Positive pairs drawn per article; as many negatives are drawn."""
    splits: SplitFractions
    seed: int


@dataclass(frozen=True)
class EmbeddedWikiQAConfig:
    """SQuAD-v2-format cloze QA built from the Wikipedia sample, split by article."""

    source: Literal["embedded"]
    asset: Literal["wiki_qa"]
    min_paragraph_chars: int
    questions_per_paragraph: int
    unanswerable_fraction: float
    """Fraction of questions made unanswerable by pairing them with a paragraph of another article."""
    splits: SplitFractions
    seed: int

    def __post_init__(self) -> None:
        if not 0 <= self.unanswerable_fraction < 1:
            raise ConfigError(f"unanswerable_fraction={self.unanswerable_fraction} must be in [0, 1)")


GlueTask = Literal["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"]


@dataclass(frozen=True)
class LocalGlueConfig:
    """A GLUE task from its original TSV files."""

    source: Literal["local"]
    format: Literal["glue"]
    task: GlueTask
    files: dict[str, str]
    """split name -> TSV path (MNLI: e.g. ``dev_matched``, ``dev_mismatched``)."""
    encoding: str
    on_bad_rows: Literal["error", "skip"]


@dataclass(frozen=True)
class LocalSquadConfig:
    """Extractive QA from SQuAD v1.1 / v2.0 JSON files."""

    source: Literal["local"]
    format: Literal["squad"]
    files: dict[str, str]
    encoding: str


@dataclass(frozen=True)
class LocalTextConfig:
    """A plain-text corpus: documents separated by blank lines, or a JSONL corpus with a text field."""

    source: Literal["local"]
    format: Literal["text", "jsonl"]
    files: dict[str, str]
    text_field: str
    """JSONL only: the key holding the document text (ignored for ``text``)."""
    encoding: str
    on_bad_rows: Literal["error", "skip"]


@dataclass(frozen=True)
class HubConfig:
    """A dataset from the Hugging Face hub, e.g. ``glue/sst2``, ``squad_v2``, ``wikimedia/wikipedia``."""

    source: Literal["hub"]
    name: str
    """``glue/<task>``, ``squad``/``squad_v2`` or any corpus with a text column."""
    subset: str | None
    """Hub configuration name (``20231101.en`` for wikipedia); null when there is none."""
    splits: dict[str, str]
    """our split -> hub split (``train: train``, ``dev: validation``)."""
    text_field: str
    """Corpora only: the column holding the text."""


PrepareDatasetConfig = Union[
    EmbeddedWikiConfig,
    EmbeddedPolarityConfig,
    EmbeddedWikiPairsConfig,
    EmbeddedWikiQAConfig,
    LocalGlueConfig,
    LocalSquadConfig,
    LocalTextConfig,
    HubConfig,
]


@dataclass(frozen=True)
class PrepareConfig:
    datasets: dict[str, PrepareDatasetConfig]


# --------------------------------------------------------------------------------------------
# tokenize: how each prepared dataset becomes teacher-tokenized rows
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenizeMLMConfig:
    """MLM corpus: pack documents into blocks, then mask each block ``mask_views`` times (static)."""

    kind: Literal["mlm"]
    mask_views: int
    """Seeded masked views per block; the teacher cache holds logits for exactly these masks."""
    mask_prob: float
    """Fraction of (non-special) tokens selected per view (BERT: 0.15)."""
    mask_token_fraction: float
    """Of selected tokens, fraction replaced by [MASK] (BERT: 0.8)."""
    random_token_fraction: float
    """Of selected tokens, fraction replaced by a random token (BERT: 0.1); the rest stay unchanged."""
    seed: int

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ConfigError(f"seed={self.seed} must be >= 0")
        if self.mask_views < 1:
            raise ConfigError(f"mask_views={self.mask_views} must be >= 1")
        if not 0 < self.mask_prob < 1:
            raise ConfigError(f"mask_prob={self.mask_prob} must be in (0, 1)")
        if not (0 <= self.mask_token_fraction and 0 <= self.random_token_fraction
                and self.mask_token_fraction + self.random_token_fraction <= 1):
            raise ConfigError("mask_token_fraction + random_token_fraction must be within [0, 1]")


@dataclass(frozen=True)
class TokenizeClassificationConfig:
    """Single-sentence / sentence-pair tasks: joint BERT encoding and separate A / B encodings."""

    kind: Literal["classification"]


@dataclass(frozen=True)
class TokenizeQAConfig:
    """Extractive QA: question + context windows of ``max_seq_len`` with ``doc_stride`` overlap."""

    kind: Literal["qa"]
    doc_stride: int
    """Tokens of overlap between consecutive context windows."""
    max_query_len: int
    """Questions longer than this are truncated (and counted)."""


TokenizeDatasetConfig = Union[TokenizeMLMConfig, TokenizeClassificationConfig, TokenizeQAConfig]


@dataclass(frozen=True)
class TokenizeConfig:
    tokenizer: str
    """Teacher tokenizer: ``embedded:minilm-l6``, a local directory, or a hub model name."""
    max_seq_len: int
    datasets: dict[str, TokenizeDatasetConfig]

    def __post_init__(self) -> None:
        if self.max_seq_len < 8:
            raise ConfigError(f"tokenize.max_seq_len={self.max_seq_len} is too small (>= 8)")
        for name, ds in self.datasets.items():
            if isinstance(ds, TokenizeQAConfig) and not 0 < ds.doc_stride < self.max_seq_len - ds.max_query_len - 3:
                raise ConfigError(f"tokenize.datasets.{name}.doc_stride must be in (0, max_seq_len - max_query_len - 3): "
                                  "a window must hold the question, 3 special tokens and more context than the stride")


# --------------------------------------------------------------------------------------------
# teacher_import / teacher_finetune: the teachers, as DVC-tracked model folders
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TeacherImportConfig:
    models: dict[str, str]
    """name -> model spec (``embedded:minilm-l6``, a local directory or a hub name); each is saved
    to ``models/teacher/<name>/`` so every machine of a team uses byte-identical teacher weights."""


@dataclass(frozen=True)
class TeacherFinetuneTaskConfig:
    epochs: int
    batch_size: int
    lr: float
    weight_decay: float
    warmup_fraction: float
    """Fraction of the steps with linear LR warm-up; then linear decay to 0."""
    max_grad_norm: float
    max_train_rows: int | None
    """Fine-tune on a seeded random subset of this many training rows (null: all rows)."""
    regression_bin_width: float | None
    """Regression tasks (STS-B): labels cast to classes of this width (CMOW paper, after Raffel
    et al.: 0.2); must be null for classification and QA."""
    checkpoint_every: int
    """Write a resumable checkpoint every this many optimizer steps (and at each epoch end)."""
    seed: int

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or self.checkpoint_every < 1:
            raise ConfigError("epochs, batch_size and checkpoint_every must be >= 1")
        if not 0 <= self.warmup_fraction < 1:
            raise ConfigError(f"warmup_fraction={self.warmup_fraction} must be in [0, 1)")
        if self.regression_bin_width is not None and self.regression_bin_width <= 0:
            raise ConfigError("regression_bin_width must be > 0 (or null)")


@dataclass(frozen=True)
class TeacherFinetuneConfig:
    device: str
    """``auto`` (CUDA when available), ``cpu`` or ``cuda[:i]``."""
    tasks: dict[str, TeacherFinetuneTaskConfig]


# --------------------------------------------------------------------------------------------
# teacher_cache: which teacher signals are stored for each dataset
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SignalsConfig:
    """What the teacher cache keeps. Never keep what no loss uses: every array costs disk and I/O."""

    logits: bool
    """Task logits (QA: start/end logits). Needs a fine-tuned task teacher."""
    mlm_topk: int
    """Top-k MLM logits (+ full-vocab logsumexp) at the statically masked positions; 0 = off.
    Needs a teacher with an MLM head."""
    hidden_layers: list[int]
    """Encoder layers (1..n_layers; 0 = embedding output) whose outputs are kept, average-pooled
    ``pool`` x along the sequence."""
    attn_layers: list[int]
    """Encoder layers whose pre-softmax attention scores are kept, max-pooled ``pool`` x ``pool``."""
    pool: int
    """Pooling factor p (WaLDORf eqs. 3 and 5: 4); 1 = unpooled (MiniALBERT)."""
    attn_probs: bool
    """Also keep unpooled attention probabilities of ``attn_layers`` (MiniALBERT attention KL): large."""
    embeddings: bool
    """Also keep the embedding-layer output, unpooled (WaLDORf embedding loss): large."""

    def __post_init__(self) -> None:
        if self.pool < 1 or self.mlm_topk < 0:
            raise ConfigError("pool must be >= 1 and mlm_topk >= 0")
        for name, low in (("hidden_layers", 0), ("attn_layers", 1)):
            layers = getattr(self, name)
            if any(j < low for j in layers) or layers != sorted(set(layers)):
                raise ConfigError(f"{name}={layers}: layers are increasing and numbered from {low}")
        if self.attn_probs and not self.attn_layers:
            raise ConfigError("attn_probs needs attn_layers")
        if not (self.logits or self.mlm_topk or self.hidden_layers or self.attn_layers or self.embeddings):
            raise ConfigError("no signal selected: the cache would be empty")


@dataclass(frozen=True)
class TeacherCacheDatasetConfig:
    teacher: str
    """Teacher name: the folder ``models/teacher/<teacher>`` (from teacher_import or teacher_finetune)."""
    head: Literal["base", "mlm", "classification", "qa"]
    """Which model head to load: ``base`` for hidden/attention only."""
    split: str
    """The tokens split to cache (students train on it)."""
    signals: SignalsConfig

    def __post_init__(self) -> None:
        if self.signals.logits and self.head not in ("classification", "qa"):
            raise ConfigError(f"signals.logits needs head classification or qa (head is {self.head})")
        if self.signals.mlm_topk and self.head != "mlm":
            raise ConfigError(f"signals.mlm_topk needs head mlm (head is {self.head})")


@dataclass(frozen=True)
class TeacherCacheConfig:
    device: str
    """``auto`` (CUDA when available), ``cpu`` or ``cuda[:i]``."""
    batch_size: int
    shard_rows: int
    """Rows per shard: the unit of work, of resume and of one writer (DESIGN: ~1,024)."""
    datasets: dict[str, TeacherCacheDatasetConfig]

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.shard_rows < 1:
            raise ConfigError("batch_size and shard_rows must be >= 1")


# --------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------

SECTIONS: dict[str, type] = {
    "prepare": PrepareConfig,
    "tokenize": TokenizeConfig,
    "teacher_import": TeacherImportConfig,
    "teacher_finetune": TeacherFinetuneConfig,
    "teacher_cache": TeacherCacheConfig,
}


def load_params(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: params file not found (run from the repository root or pass --params)")
    with path.open(encoding="utf-8") as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return data


def load_section(name: str, path: str | Path = "params.yaml"):
    """Load the ``name`` section of ``path`` into its config dataclass."""
    if name not in SECTIONS:
        raise ConfigError(f"no config section named {name!r}; known: {sorted(SECTIONS)}")
    data = load_params(path)
    if name not in data:
        raise ConfigError(f"{path}: missing section {name!r}")
    return build(SECTIONS[name], data[name], name, path)


def build(tp: Any, value: Any, key: str, path: str | Path = "params.yaml") -> Any:
    """Build a value of type ``tp`` from plain YAML data, checking it strictly."""
    where = f"{path}: {key}"
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _build_dataclass(tp, value, key, path)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if type(None) in args:
            if value is None:
                return None
            rest = tuple(a for a in args if a is not type(None))
            return build(rest[0] if len(rest) == 1 else Union[rest], value, key, path)
        if all(dataclasses.is_dataclass(a) for a in args):
            return build(_pick_variant(args, value, key, path), value, key, path)
        raise TypeError(f"unsupported union {tp}")  # programming error, not a user error
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{where}: {value!r} is not one of {list(allowed)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        (item,) = typing.get_args(tp)
        return [build(item, v, f"{key}[{i}]", path) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__} {value!r}")
        _, item = typing.get_args(tp)
        return {str(k): build(item, v, f"{key}.{k}", path) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {type(value).__name__} {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp}")


# Keys that tell the variants of a tagged union apart; other Literal fields are ordinary choices.
TAG_KEYS = ("source", "asset", "format", "kind")


def _literal_fields(cls: type) -> dict[str, tuple]:
    hints = typing.get_type_hints(cls)
    return {k: typing.get_args(t) for k, t in hints.items() if k in TAG_KEYS and typing.get_origin(t) is Literal}


def _pick_variant(variants: tuple, value: Any, key: str, path: str | Path) -> type:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: {key}: expected a mapping, got {value!r}")
    matches = []
    for cls in variants:
        tags = _literal_fields(cls)
        if all(value.get(k) in allowed for k, allowed in tags.items()):
            matches.append(cls)
    if len(matches) == 1:
        return matches[0]
    if not matches:
        # Name the tag keys, with the values each variant accepts, so the fix is obvious.
        options = [
            ", ".join(f"{k}={'|'.join(map(str, v))}" for k, v in _literal_fields(cls).items())
            for cls in variants
        ]
        got = {k: value.get(k) for cls in variants for k in _literal_fields(cls)}
        raise ConfigError(f"{path}: {key}: {got} matches no known kind; expected one of: {'; '.join(options)}")
    raise TypeError(f"{key}: ambiguous config variants {matches}")


def _build_dataclass(cls: type, value: Any, key: str, path: str | Path) -> Any:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: {key}: expected a mapping for {cls.__name__}, got {value!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise ConfigError(f"{path}: {key}: unknown key(s) {unknown}; expected {names}")
    missing = [n for n in names if n not in value]
    if missing:
        raise ConfigError(f"{path}: {key}: missing key(s) {missing}")
    kwargs = {n: build(hints[n], value[n], f"{key}.{n}", path) for n in names}
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{path}: {key}: {e}") from None
