"""Tiny BERT teachers and token datasets built in-process, for hermetic tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

WORDS = [f"w{i}" for i in range(60)]
# A WaLDORf small enough for a test to train in seconds (heads = the tiny teachers' 4, for the attention loss).
TINY_WALDORF = {"student": "waldorf", "embedding_size": 16, "conv_channels": [16, 32], "conv_kernel": 3,
                "d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64, "dropout": 0.0, "init_std": 0.02,
                "embedding_init": "random"}
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def make_tiny_bert_dir(path: Path, *, hidden: int = 32, layers: int = 2, heads: int = 4, seed: int = 0,
                       num_labels: int = 0, qa: bool = False) -> Path:
    """Save a random tiny BertModel (a BertForSequenceClassification when ``num_labels``, a
    BertForQuestionAnswering when ``qa``) and a fast WordPiece tokenizer in save_pretrained layout."""
    import torch
    from transformers import (
        BertConfig,
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertModel,
        BertTokenizerFast,
    )

    path.mkdir(parents=True, exist_ok=True)
    vocab = path / "vocab.txt"
    vocab.write_text("\n".join(SPECIAL + WORDS) + "\n")
    BertTokenizerFast(vocab=str(vocab), do_lower_case=True).save_pretrained(path)
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(SPECIAL) + len(WORDS), hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=heads, intermediate_size=2 * hidden, max_position_embeddings=64,
                     num_labels=max(num_labels, 2))
    cls = BertForQuestionAnswering if qa else BertForSequenceClassification if num_labels else BertModel
    cls(cfg).save_pretrained(path)
    return path


def make_qa_tokens(root: Path, model_dir: Path, n_train: int = 48, n_dev: int = 16, seed: int = 0,
                   n_test: int = 0) -> tuple[Path, Path]:
    """A tiny SQuAD-v2-format dataset over the tiny vocabulary (the answer is the word after w9; a third of
    the questions unanswerable), prepared and tokenized with the real tokenize stage: (prepared, tokens)."""
    from datasets import Dataset, DatasetDict, Features, Sequence, Value

    from distillpipe.config.tokenize import TokenizeConfig, TokenizeQAConfig
    from distillpipe.data.schema import write_meta
    from distillpipe.data.tokenize import tokenize_dataset

    features = Features({"id": Value("string"), "title": Value("string"), "context": Value("string"),
                         "question": Value("string"),
                         "answers": {"text": Sequence(Value("string")), "answer_start": Sequence(Value("int32"))}})
    rng = np.random.default_rng(seed)

    def split(name: str, n: int) -> Dataset:
        rows = {k: [] for k in features}
        for i in range(n):
            words = [f"w{int(w)}" for w in rng.integers(10, 60, size=int(rng.integers(12, 30)))]
            answerable = i % 3 != 2
            if answerable:
                k = int(rng.integers(0, len(words) - 1))
                words[k] = "w9"
            context = " ".join(words)
            ans = {"text": [], "answer_start": []}
            if answerable:
                start = len(" ".join(words[: k + 1])) + 1
                ans = {"text": [words[k + 1]], "answer_start": [start]}
            for key, v in (("id", f"{name}-{i}"), ("title", f"t{i}"), ("context", context),
                           ("question", "w1 w2 w9"), ("answers", ans)):
                rows[key].append(v)
        return Dataset.from_dict(rows, features=features)

    prepared, tokens = root / "qa_prepared", root / "qa_tokens"
    splits = {"train": split("train", n_train), "dev": split("dev", n_dev)}
    if n_test:
        splits["test"] = split("test", n_test)
    DatasetDict(splits).save_to_disk(str(prepared))
    write_meta(prepared, {"name": "toy_qa", "task_type": "qa"})
    qa_cfg = TokenizeQAConfig("qa", doc_stride=8, max_query_len=8, max_seq_len=None)
    cfg = TokenizeConfig(str(model_dir), 32, {"toy_qa": qa_cfg})
    tokenize_dataset("toy_qa", prepared, cfg, tokens)
    return prepared, tokens


def tokenizer_meta(model_dir: Path) -> dict:
    from distillpipe.assets import tokenizer_sha256

    return {"spec": str(model_dir), "sha256": tokenizer_sha256(model_dir), "vocab_size": len(SPECIAL) + len(WORDS),
            "pad_id": 0, "cls_id": 2, "sep_id": 3, "mask_id": 4}


def make_classification_tokens(path: Path, model_dir: Path, n_train: int = 96, n_dev: int = 32, seed: int = 0,
                               regression: bool = False) -> Path:
    """A learnable binary task: label 1 iff token id 7 occurs in the sentence (regression: a score
    of 0.6 or 0.2, STS-B-like)."""
    from datasets import Dataset, DatasetDict

    from distillpipe.data.schema import write_meta

    rng = np.random.default_rng(seed)

    def split(n):
        rows = {"input_ids": [], "token_type_ids": [], "length": [], "label": [], "example_id": []}
        for i in range(n):
            k = int(rng.integers(4, 14))
            body = rng.integers(8, 60, size=k).tolist()
            label = int(i % 2)
            if label:
                body[int(rng.integers(0, k))] = 7
            ids = [2] + body + [3]
            rows["input_ids"].append(ids)
            rows["token_type_ids"].append([0] * len(ids))
            rows["length"].append(len(ids))
            rows["label"].append((0.6 if label else 0.2) if regression else label)
            rows["example_id"].append(f"ex{i}")
        return Dataset.from_dict(rows)

    DatasetDict({"train": split(n_train), "dev": split(n_dev)}).save_to_disk(str(path))
    write_meta(path, {"name": "toy", "task_type": "regression" if regression else "classification",
                      "kind": "classification", "label_names": None if regression else ["no", "yes"],
                      "num_labels": 1 if regression else 2, "fingerprint": f"toy-{seed}-{regression}",
                      "tokenizer": tokenizer_meta(model_dir), "max_seq_len": 32, "params": {}, "summary": {}})
    return path


def make_mlm_tokens(path: Path, model_dir: Path, n_rows: int = 100, seed: int = 0, max_seq_len: int = 32,
                    n_dev: int = 0, repeat: bool = False, held_out: bool = False) -> Path:
    """Random MLM rows in the tokens format (lengths vary, a few masked positions each); the first
    ``n_dev`` rows form a dev split when ``n_dev`` > 0 (``held_out``: ``n_dev`` further rows, none of them in
    train). ``repeat``: each row is one token repeated, so a masked token can be read from its context."""
    from datasets import Dataset, DatasetDict

    from distillpipe.data.schema import write_meta

    rng = np.random.default_rng(seed)
    rows = {k: [] for k in ("input_ids", "token_type_ids", "length", "block_id", "view", "masked_positions",
                            "masked_labels")}
    for i in range(n_rows + (n_dev if held_out else 0)):
        n = int(rng.integers(6, max_seq_len + 1))
        body = [int(rng.integers(5, 65))] * (n - 2) if repeat else rng.integers(5, 65, size=n - 2).tolist()
        ids = [2] + body + [3]
        pos = sorted(rng.choice(np.arange(1, n - 1), size=max(1, (n - 2) // 7), replace=False).tolist())
        labels = [ids[p] for p in pos]
        for p in pos:
            ids[p] = 4
        for k, v in (("input_ids", ids), ("token_type_ids", [0] * n), ("length", n), ("block_id", i), ("view", 0),
                     ("masked_positions", pos), ("masked_labels", labels)):
            rows[k].append(v)
    splits = {"train": Dataset.from_dict({k: v[:n_rows] for k, v in rows.items()})}
    if n_dev:
        splits["dev"] = Dataset.from_dict({k: v[n_rows:] if held_out else v[:n_dev] for k, v in rows.items()})
    DatasetDict(splits).save_to_disk(str(path))
    write_meta(path, {"name": "toy_mlm", "task_type": "corpus", "kind": "mlm", "num_labels": 0, "label_names": None,
                      "fingerprint": f"mlm-{seed}-{n_rows}", "tokenizer": tokenizer_meta(model_dir),
                      "max_seq_len": max_seq_len, "params": {}, "summary": {}})
    return path


PRECISION_F16 = {"hidden": "float16", "attention": "float16", "mlm_topk": "float16"}
"""teacher_cache signals.precision: every signal stored float16."""


def signals(**over) -> dict:
    """teacher_cache signals: dense float16 hidden states of layers 1 and 2 and pooled scores of layer 2 unless
    ``over`` says otherwise (``hidden_rank``/``attn_rank`` for the compact forms)."""
    s = {"logits": False, "mlm_topk": 0, "hidden_layers": [1, 2], "hidden_rank": None, "hidden_fit_rows": 16,
         "attn_layers": [2], "attn_rank": None, "pool": 2, "attn_probs": False, "embeddings": False,
         "precision": PRECISION_F16}
    s.update(over)
    return s


def make_classification_store(root: Path) -> dict:
    """A tiny 2-class teacher, its tokens (96 train / 32 dev) and a logits-only teacher cache of them under
    ``root``: ``{"root", "tokens", "store"}``."""
    from distillpipe.config.base import build
    from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
    from distillpipe.teacher.cache import build_teacher_cache

    clf = make_tiny_bert_dir(root / "clf", num_labels=2, seed=1)
    tokens = make_classification_tokens(root / "cls", clf, n_train=96, n_dev=32)
    cfg = build(TeacherCacheDatasetConfig, {"teacher": "t", "head": "classification", "split": "train",
                                            "max_rows": None,
                                            "signals": signals(logits=True, hidden_layers=[], attn_layers=[],
                                                               pool=1)}, "teacher_cache.datasets.toy")
    build_teacher_cache("toy", tokens, clf, cfg, "cpu", 16, 32, root / "cls.zarr", cpu_threads=1)
    return {"root": root, "tokens": tokens, "store": root / "cls.zarr"}


def finetune_params(**over) -> dict:
    cfg = {"epochs": 3, "batch_size": 8, "lr": 2e-3, "lr_grid": None, "weight_decay": 0.0, "warmup_fraction": 0.0,
           "max_grad_norm": 1.0, "max_train_rows": None, "regression_bin_width": None,
           "checkpoint_minutes": 10, "seed": 0}
    cfg.update(over)
    return cfg


def write_params(path: Path, sections: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(sections))
    return path


def dumps(obj) -> str:
    return json.dumps(obj, indent=2)


# `distillpipe train` in a subprocess that SIGKILLs itself right after the checkpoint of step KILL_AT_STEP is on disk:
# from the background thread that wrote it (checkpoints.Checkpointer), while training has gone on (nothing of it
# was saved since, and the next checkpoint's write cannot have started: it waits for this one).
_TRAIN_DRIVER = """
import os, signal, sys
from distillpipe import checkpoints
kill_at = int(os.environ["KILL_AT_STEP"])
orig = checkpoints.save_checkpoint
def save(folder, step, state, keep=2):
    path = orig(folder, step, state, keep)
    if step == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return path
checkpoints.save_checkpoint = save
from distillpipe.cli import app
app(sys.argv[1:], prog_name="train")
"""


def _train_args(run: str, *, tokens: Path, store: Path, prepared: Path, out: Path, params: Path,
                init: Path | None = None, word_vectors: Path | None = None) -> list[str]:
    command = ["train"] if init is None else ["finetune", "--init", str(init)]
    if word_vectors is not None:
        command = ["train-lm", "--word-vectors", str(word_vectors)]
    source = "--teacher-cache" if word_vectors is not None else "--teacher"  # train-lm reads a store's row order
    return [*command, "--run", run, "--tokens", str(tokens), source, str(store), "--prepared",
            str(prepared), "--out", str(out), "--checkpoints", f"{out}.ckpt", "--live", f"{out}.live", "--params",
            str(params)]


def run_train_cli(run: str, *, tokens: Path, store: Path, prepared: Path, out: Path, params: Path,
                  kill_at: int | None = None, init: Path | None = None, word_vectors: Path | None = None):
    """Run `distillpipe train --run RUN` (`finetune --init INIT` when ``init`` is given, `train-lm --word-vectors
    W` when ``word_vectors`` is) in a process of its own writing beside ``out``; killed with SIGKILL after step
    ``kill_at``."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "KILL_AT_STEP": str(-1 if kill_at is None else kill_at)}
    args = _train_args(run, tokens=tokens, store=store, prepared=prepared, out=out, params=params, init=init,
                       word_vectors=word_vectors)
    return subprocess.run([sys.executable, "-c", _TRAIN_DRIVER, *args], env=env, capture_output=True, text=True,
                          check=False)


def invoke_train_cli(run: str, *, tokens: Path, store: Path, prepared: Path, out: Path, params: Path,
                     init: Path | None = None, word_vectors: Path | None = None):
    """The same command as :func:`run_train_cli`, run in this process (:func:`invoke_cli`)."""
    return invoke_cli(_train_args(run, tokens=tokens, store=store, prepared=prepared, out=out, params=params,
                                  init=init, word_vectors=word_vectors))


def invoke_cli(args: list, env: dict | None = None):
    """`distillpipe ARGS` run in this process through the real typer app (click's CliRunner), returned as a
    subprocess would return it: exit status, stdout, and stderr with the log records (INFO and up, the default of
    DISTILLPIPE_LOG) and any uncaught traceback. It saves the ~5 s (2 quiet cores) a new process spends importing
    torch, transformers and datasets: for the runs a test compares with or resumes; a run to SIGKILL still needs a
    process of its own."""
    import io
    import logging
    import subprocess
    import traceback

    from typer.testing import CliRunner

    from distillpipe.cli import app

    args = [str(a) for a in args]
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        res = CliRunner().invoke(app, args, env=env)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    stderr = res.stderr + log.getvalue()
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        stderr += "".join(traceback.format_exception(res.exception))
    return subprocess.CompletedProcess(["distillpipe", *args], res.exit_code, res.stdout, stderr)


def local_files(files: dict) -> dict:
    """``path`` and ``files`` of a ``prepare.local`` entry for files anywhere: their deepest common folder and
    the names relative to it."""
    import os

    paths = {k: Path(v).resolve() for k, v in files.items()}
    root = Path(os.path.commonpath([str(p.parent) for p in paths.values()]))
    return {"path": str(root), "files": {k: p.relative_to(root).as_posix() for k, p in paths.items()}}


def read_curve(live: Path, name: str) -> dict[int, float]:
    """{step: value} of the curve ``name`` in a dvclive folder, read from its TSV as ``dvc plots`` does
    (``<live>/plots/metrics/<name>.tsv``, columns step and the name's last part)."""
    lines = (Path(live) / "plots" / "metrics" / f"{name}.tsv").read_text().splitlines()
    assert lines[0].split("\t") == ["step", name.rsplit("/", 1)[-1]], lines[0]
    return {int(step): float(value) for step, value in (line.split("\t") for line in lines[1:])}


def live_files(live: Path) -> dict[str, bytes]:
    """Every file of a dvclive folder (relative path: bytes)."""
    return {p.relative_to(live).as_posix(): p.read_bytes() for p in sorted(Path(live).rglob("*")) if p.is_file()}
