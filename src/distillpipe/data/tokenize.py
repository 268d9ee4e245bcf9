"""The ``tokenize`` stage: prepared datasets -> teacher-tokenized rows (the ``Tokens`` format).

Owns the entry point :func:`tokenize_dataset`, the tokens fingerprint (a content
digest) that the teacher cache checks, and the Arrow writing. The rows of each kind are encoded by
:mod:`distillpipe.data.classification` (joint ``[CLS] a [SEP] b [SEP]`` and separate ``[CLS] x [SEP]`` for
DiffCat), :mod:`distillpipe.data.masking` (MLM packing and static masking) and :mod:`distillpipe.data.qa_windows`.

Splits are written batch by batch as Arrow streams (memory stays bounded by one batch), then saved
with ``DatasetDict.save_to_disk`` into a temporary folder beside ``out_dir`` that is renamed into
place at the end, so a killed run never leaves a half-written ``out_dir``.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from distillpipe.assets import load_tokenizer, tokenizer_sha256
from distillpipe.config.tokenize import (
    TokenizeClassificationConfig,
    TokenizeConfig,
    TokenizeMLMConfig,
    TokenizeQAConfig,
)
from distillpipe.data import schema
from distillpipe.data.classification import classification_columns
from distillpipe.data.masking import MaskingSpec, masked_rows, pack_blocks
from distillpipe.data.qa_windows import check_lengths, qa_window_columns
from distillpipe.data.subset import row_subset
from distillpipe.errors import UserError
from distillpipe.identity import json_sha256, sha256_dir, sha256_file
from distillpipe.progress import Progress

log = logging.getLogger(__name__)

KIND_OF_TASK = {"corpus": "mlm", "classification": "classification", "regression": "classification", "qa": "qa"}


class TokenizeError(UserError, ValueError):
    """The prepared data, the tokenizer or the tokenize params do not fit together."""


@dataclass
class TokenizeSummary:
    name: str
    kind: str
    examples: dict[str, int]
    """Prepared rows read, per split."""
    rows: dict[str, int]
    """Token rows written, per split."""
    truncated: int
    """Sequences cut to fit (classification: joint encodings; qa: questions over max_query_len)."""
    windows: int
    """Distinct sequences: qa context windows, mlm blocks (each written ``views`` times), classification rows."""
    views: int
    tokens: int
    """Tokens in the distinct sequences (an mlm block counts once, not once per view)."""
    seconds: float
    counts: dict[str, int] = field(default_factory=dict)
    """Kind-specific details (truncated_a/b, answerable, documents, ...)."""

    def one_line(self) -> str:
        rows = sum(self.rows.values())
        if self.kind == "mlm":
            what = f"{self.windows:,} blocks x {self.views} views"
            cut = f"{self.truncated:,} truncated"
        elif self.kind == "qa":
            what = f"{sum(self.examples.values()):,} examples -> {self.windows:,} windows"
            cut = f"{self.truncated:,} questions truncated"
        else:
            what = "pairs" if self.counts.get("pair") else "single sentences"
            cut = f"{self.truncated:,} truncated"
        rate = _si(self.tokens / self.seconds) if self.seconds > 0 else "inf"
        return f"tokenize {self.name}: {rows:,} rows ({what}), {cut}, {self.seconds:.1f} s, {rate} tokens/s"

    def to_meta(self) -> dict[str, Any]:
        """The summary for meta.json, without the timing, so that a re-run writes identical files."""
        d = dataclasses.asdict(self)
        del d["seconds"]
        return d


def _si(x: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.{1 if x < 10 * scale else 0}f}{unit}"
    return f"{x:.0f}"


# --------------------------------------------------------------------------------------------
# tokenizer, params, fingerprint
# --------------------------------------------------------------------------------------------


def tokenizer_meta(tok: Any, spec: str, sha256: str) -> dict[str, Any]:
    return {"spec": spec, "sha256": sha256, "vocab_size": len(tok), "pad_id": tok.pad_token_id,
            "cls_id": tok.cls_token_id, "sep_id": tok.sep_token_id, "mask_id": tok.mask_token_id}


def dataset_params(cfg: TokenizeConfig, name: str) -> dict[str, Any]:
    """What decides the tokens of ``name`` besides the input and the tokenizer: its config + max_seq_len."""
    # the effective length under the same key: a dataset on the global length keeps the params it had before
    # datasets could set their own
    return {**dataclasses.asdict(cfg.datasets[name]), "max_seq_len": cfg.seq_len(name)}


def tokens_fingerprint(tokens_dir: str | Path) -> str:
    """Content digest of a tokens folder: its Arrow files and its meta.json, without the fingerprint itself,
    the summary (counts, shown to people) and the tokenizer's spec (where it was read from; its sha256
    stays). The teacher cache's manifest holds it, so a cache is reused exactly when the tokens are the
    same bytes, whatever code, params or inputs produced them, and rebuilt whenever they are not."""
    meta = schema.read_meta(tokens_dir)
    meta = {k: v for k, v in meta.items() if k not in ("fingerprint", "summary")}
    meta["tokenizer"] = {k: v for k, v in meta["tokenizer"].items() if k != "spec"}
    return json_sha256({"arrow": sha256_dir(tokens_dir, ["*.arrow"]), "meta": meta})


# --------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------


def tokenize_dataset(name: str, prepared_dir: Path, cfg: TokenizeConfig, out_dir: Path, *,
                     batch_size: int = 1000) -> TokenizeSummary:
    """Tokenize every split of the prepared dataset ``name`` into ``out_dir`` (the Tokens format).

    ``batch_size`` (prepared rows per tokenizer call) changes speed and memory, never the output.
    """
    from datasets import DatasetDict, load_from_disk

    t0 = time.perf_counter()
    prepared_dir, out_dir = Path(prepared_dir), Path(out_dir)
    if name not in cfg.datasets:
        raise TokenizeError(f"params.yaml: tokenize.datasets has no entry {name!r}; known: {sorted(cfg.datasets)}")
    dcfg = cfg.datasets[name]
    meta_in = schema.read_meta(prepared_dir)
    task_type = meta_in.get("task_type")
    if task_type not in KIND_OF_TASK:
        raise TokenizeError(f"{prepared_dir}/{schema.META_FILE}: task_type {task_type!r} is not one of "
                            f"{schema.TASK_TYPES}")
    if KIND_OF_TASK[task_type] != dcfg.kind:
        raise TokenizeError(
            f"params.yaml: tokenize.datasets.{name}.kind is {dcfg.kind!r}, but {prepared_dir} holds a "
            f"{task_type!r} dataset, which needs kind: {KIND_OF_TASK[task_type]}"
        )
    dd = load_from_disk(str(prepared_dir))
    if not isinstance(dd, DatasetDict):
        raise TokenizeError(f"{prepared_dir} holds a single Dataset; the prepare stage writes a DatasetDict of splits")

    tok, model_dir = load_tokenizer(cfg.tokenizer)
    tok_sha = tokenizer_sha256(model_dir)
    params = dataset_params(cfg, name)
    writer = _SplitWriter(name, dcfg, task_type, meta_in, tok, cfg.seq_len(name), batch_size)

    tmp = out_dir.parent / f".{out_dir.name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)  # left by a killed run
    (tmp / "work").mkdir(parents=True)
    try:
        summary = writer.run(dd, tmp, t0)
        meta = {"name": name, "task_type": task_type, "kind": dcfg.kind, "fingerprint": None,
                "num_labels": meta_in.get("num_labels"), "label_names": meta_in.get("label_names"),
                # False for generated rows without ground truth (augment): students use teacher losses only
                "labeled": schema.is_labeled(meta_in),
                "tokenizer": tokenizer_meta(tok, cfg.tokenizer, tok_sha), "max_seq_len": cfg.seq_len(name),
                "params": params, "summary": summary.to_meta()}
        schema.write_meta(tmp / "out", meta)
        meta["fingerprint"] = tokens_fingerprint(tmp / "out")
        schema.write_meta(tmp / "out", meta)
        _replace_dir(tmp / "out", out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summary.seconds = time.perf_counter() - t0
    log.debug("%s", summary.one_line())  # the CLI prints it
    return summary


def _replace_dir(src: Path, dst: Path) -> None:
    old = dst.parent / f".{dst.name}.old"
    if old.exists():
        shutil.rmtree(old)
    if dst.exists():
        dst.rename(old)
    src.rename(dst)
    if old.exists():
        shutil.rmtree(old)


class _SplitWriter:
    """Runs one dataset kind over every split and writes the Arrow streams."""

    def __init__(self, name: str, dcfg: Any, task_type: str, meta_in: dict, tok: Any, max_seq_len: int,
                 batch_size: int) -> None:
        self.name, self.dcfg, self.task_type, self.meta_in = name, dcfg, task_type, meta_in
        self.tok, self.max_seq_len, self.batch_size = tok, max_seq_len, batch_size
        try:  # the helpers raise ValueError; the CLI reports TokenizeError as a user error
            if isinstance(dcfg, TokenizeMLMConfig):
                if tok.mask_token_id is None:
                    raise ValueError("kind is mlm but the tokenizer has no mask token")
                self.spec = MaskingSpec.build(
                    mask_prob=dcfg.mask_prob, mask_token_fraction=dcfg.mask_token_fraction,
                    random_token_fraction=dcfg.random_token_fraction, seed=dcfg.seed, mask_id=tok.mask_token_id,
                    special_ids=tok.all_special_ids, vocab_size=len(tok))
            if isinstance(dcfg, TokenizeQAConfig):
                check_lengths(tok, max_seq_len, dcfg.doc_stride, dcfg.max_query_len)
        except ValueError as e:
            raise TokenizeError(f"tokenize.datasets.{name}: {e}") from None

    def run(self, dd: Any, tmp: Path, t0: float) -> TokenizeSummary:
        from datasets import Dataset, DatasetDict

        examples, rows, counts = {}, {}, {}
        paths = {}
        for split, ds in dd.items():
            paths[split] = tmp / "work" / f"{split}.arrow"
            n_rows = 0
            with Progress(total=len(ds), desc=f"tokenize {self.name}/{split}", unit="rows") as bar:
                features, batches = self._split(split, ds, counts, bar)
                schema_ = features.arrow_schema
                with pa.OSFile(str(paths[split]), "wb") as sink, pa.ipc.new_stream(sink, schema_) as out:
                    for cols in batches:
                        out.write_batch(to_record_batch(cols, schema_))
                        n_rows += len(cols["length"])
                        _add(counts, "tokens", int(np.sum(_distinct_lengths(cols))))
            if n_rows == 0:  # datasets cannot load an empty split back, and nothing could train on it
                raise TokenizeError(f"prepared {self.name}/{split} ({len(ds)} rows) gives no tokens: its texts are "
                                    "empty; check the prepare stage's output")
            examples[split], rows[split] = len(ds), n_rows
            log.info("tokenize %s/%s: %d prepared rows -> %d token rows", self.name, split, len(ds), n_rows)
        # datasets fingerprints a Dataset read from a file by the file's PATH, and save_to_disk writes that into
        # state.json: the folder's bytes (and DVC's md5 of it) would then differ per checkout and send every
        # downstream stage into a pointless re-run. The split's content digest is path-free and as unique.
        loaded = {s: Dataset.from_file(str(p)) for s, p in paths.items()}
        out_dd = DatasetDict({s: Dataset(d.data, info=d.info, split=d.split, fingerprint=sha256_file(paths[s])[:16])
                              for s, d in loaded.items()})
        out_dd.save_to_disk(str(tmp / "out"))
        del out_dd
        kind = self.dcfg.kind
        windows = {"mlm": counts.get("blocks", 0), "qa": counts.get("windows", 0)}.get(kind, sum(rows.values()))
        truncated = counts.get("truncated_questions" if kind == "qa" else "truncated", 0)
        return TokenizeSummary(self.name, kind, examples, rows, truncated, windows,
                               getattr(self.dcfg, "mask_views", 1), counts.pop("tokens", 0),
                               time.perf_counter() - t0, counts)

    def _split(self, split: str, ds: Any, counts: dict[str, int], bar: Progress):
        from datasets import Features, List, Value

        base = {"input_ids": List(Value("int32")), "token_type_ids": List(Value("int8")), "length": Value("int32")}
        ids = List(Value("int32"))
        if isinstance(self.dcfg, TokenizeMLMConfig):
            _require(ds, split, self.name, ("doc_id", "text"))
            features = Features({**base, "block_id": Value("int64"), "view": Value("int32"),
                                 "masked_positions": ids, "masked_labels": ids})
            return features, self._mlm(split, ds, counts, bar)
        if isinstance(self.dcfg, TokenizeQAConfig):
            _require(ds, split, self.name, ("id", "context", "question", "answers"))
            features = Features({**base, "example_id": Value("string"),
                                 "offset_mapping": List(List(Value("int32"), length=2)),
                                 "start_positions": Value("int32"), "end_positions": Value("int32"),
                                 "has_answer": Value("bool")})
            return features, self._qa(ds, counts, bar)
        assert isinstance(self.dcfg, TokenizeClassificationConfig)
        _require(ds, split, self.name, ("id", "text_a", "label"))
        pair = "text_b" in ds.column_names
        text_fields = self.meta_in.get("text_fields") or []
        if len(text_fields) == 2 and not pair:
            raise TokenizeError(f"{self.name}/{split}: meta.json text_fields {text_fields} names two texts but "
                                f"the split has no text_b column (columns: {ds.column_names})")
        counts["pair"] = int(pair)
        label = Value("float32" if self.task_type == "regression" else "int64")
        features = Features({**base, "example_id": Value("string"), "label": label,
                             "a_input_ids": ids, "b_input_ids": ids})
        return features, self._classification(ds, pair, counts, bar)

    def _mlm(self, split: str, ds: Any, counts: dict[str, int], bar: Progress) -> Iterator[dict[str, list]]:
        def corpus_rows():
            prev = None
            for batch in ds.iter(batch_size=self.batch_size):
                enc = self.tok(batch["text"], add_special_tokens=False, return_attention_mask=False,
                               return_token_type_ids=False, verbose=False)
                for doc_id in batch["doc_id"]:
                    _add(counts, "documents", int(doc_id != prev))
                    prev = doc_id
                bar.update(len(batch["text"]))
                yield from zip(batch["doc_id"], enc["input_ids"])

        blocks = pack_blocks(corpus_rows(), self.max_seq_len, self.tok.cls_token_id, self.tok.sep_token_id)
        keep = None
        if split != "train" and self.dcfg.max_eval_blocks is not None:
            blocks = list(blocks)
            keep = row_subset(len(blocks), self.dcfg.max_eval_blocks)
            if keep is not None:
                _add(counts, f"{split}_blocks_dropped", len(blocks) - len(keep))
                log.info("tokenize %s/%s: %d evenly spaced blocks of %d kept (max_eval_blocks)", self.name, split,
                         len(keep), len(blocks))
        for cols in masked_rows(blocks, self.spec, split, self.dcfg.mask_views, self.batch_size, keep=keep):
            _add(counts, "blocks", sum(v == 0 for v in cols["view"]))
            _add(counts, "masked", sum(len(p) for p in cols["masked_positions"]))
            yield cols

    def _qa(self, ds: Any, counts: dict[str, int], bar: Progress) -> Iterator[dict[str, list]]:
        for batch in ds.iter(batch_size=self.batch_size):
            cols, c = qa_window_columns(self.tok, batch, self.max_seq_len, self.dcfg.doc_stride,
                                        self.dcfg.max_query_len)
            for k, v in c.items():
                _add(counts, k, v)
            bar.update(len(batch["id"]))
            yield cols
        for key, what in (("answers_in_no_window", "answers fall in no window"),
                          ("answer_text_mismatch", "answers do not match context[answer_start:]")):
            if counts.get(key):
                log.warning("tokenize %s: %d %s (labelled 0/0)", self.name, counts[key], what)

    def _classification(self, ds: Any, pair: bool, counts: dict[str, int], bar: Progress) -> Iterator[dict[str, list]]:
        for batch in ds.iter(batch_size=self.batch_size):
            cols, c = classification_columns(self.tok, batch, pair, self.max_seq_len)
            for k, v in c.items():
                _add(counts, k, v)
            bar.update(len(batch["id"]))
            yield cols


def _add(counts: dict[str, int], key: str, n: int) -> None:
    counts[key] = counts.get(key, 0) + int(n)


def _require(ds: Any, split: str, name: str, columns: tuple[str, ...]) -> None:
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise TokenizeError(f"prepared {name}/{split} lacks column(s) {missing} (has {ds.column_names}); "
                            "see distillpipe.data.schema for the Prepared format")


def _distinct_lengths(cols: dict[str, list]) -> list[int]:
    if "view" in cols:
        return [n for n, v in zip(cols["length"], cols["view"]) if v == 0]
    return cols["length"]


# --------------------------------------------------------------------------------------------
# Arrow
# --------------------------------------------------------------------------------------------


def to_record_batch(cols: dict[str, list], arrow_schema: pa.Schema) -> pa.RecordBatch:
    """Columns of Python/numpy values -> one record batch of exactly ``arrow_schema`` (list columns
    are built from one flat numpy array, which is much faster than Python lists of lists)."""
    arrays = []
    for f in arrow_schema:
        values = cols[f.name]
        arrays.append(_list_array(values, f.type) if pa.types.is_list(f.type) else pa.array(values, type=f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


def _list_array(seqs: list, list_type: pa.DataType) -> pa.Array:
    inner = list_type.value_type
    fixed = pa.types.is_fixed_size_list(inner)
    leaf = inner.value_type if fixed else inner
    dtype = np.dtype(leaf.to_pandas_dtype())
    parts = [np.asarray(s, dtype=dtype).reshape(-1) for s in seqs]
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    lengths = np.fromiter((p.size for p in parts), dtype=np.int64, count=len(parts))
    if fixed:
        lengths //= inner.list_size
    offsets = np.zeros(len(parts) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = pa.array(flat, type=leaf)
    if fixed:
        values = pa.FixedSizeListArray.from_arrays(values, inner.list_size)
    return pa.ListArray.from_arrays(pa.array(offsets), values, type=list_type)
