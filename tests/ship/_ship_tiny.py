"""Tiny evaluated runs for the export/predict tests: a prepared dataset of real text over the tiny vocabulary,
tokenized by the real tokenize stage, a student with random (but far from uniform) weights saved as training
saves it, and the real evaluate stage's records beside it, laid out as the pipeline lays them out."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
import yaml
from _tiny import TINY_WALDORF, make_qa_tokens, make_tiny_bert_dir

from distillpipe.config.base import build
from distillpipe.config.evaluate import EvaluateConfig
from distillpipe.config.students import CMOWHybridConfig, ElmoConfig, HeadConfig, MiniALBERTConfig, WaLDORfConfig
from distillpipe.config.tokenize import TokenizeClassificationConfig, TokenizeConfig
from distillpipe.data.schema import read_meta, write_meta
from distillpipe.data.tokenize import tokenize_dataset
from distillpipe.evaluate.run import evaluate_run
from distillpipe.identity import code_identity, stage_code
from distillpipe.students import build_student, save_student
from distillpipe.students.base import TaskSpec
from distillpipe.train.build import CODE_STAGES

MAX_LEN = 32
BIN_WIDTH = 0.2
CMOW = {"student": "cmow_hybrid", "variant": "hybrid", "bidirectional": True, "d": 4, "d_vec": 8, "init_std": 0.3,
        "embedding_init": "random", "dropout": 0.0}
MINIALBERT = {"student": "minialbert", "embedding_size": 8, "d_model": 16, "n_heads": 4, "d_ff": 32,
              "n_iterations": 2, "adapter_size": 4, "max_position_embeddings": MAX_LEN, "dropout": 0.0,
              "init_std": 0.3, "embedding_init": "random"}
WALDORF = {**TINY_WALDORF, "init_std": 0.3}
ELMO = {"student": "elmo", "d_input": 8, "output": "continuous", "d_hidden": 16, "d_proj": 8, "n_layers": 2,
        "adaptive_cutoffs": [10], "adaptive_div_value": 4.0, "dropout": 0.0, "init_std": 0.1}
CONFIGS = {"cmow_hybrid": CMOWHybridConfig, "minialbert": MiniALBERTConfig, "waldorf": WaLDORfConfig,
           "elmo": ElmoConfig}
BOOTSTRAP = {"n_resamples": 200, "confidence": 0.95, "seed": 0}


def _sentence(rng: np.random.Generator, n: int) -> str:
    return " ".join(f"w{int(w)}" for w in rng.integers(10, 60, size=n))


def make_prepared(path: Path, *, pair: bool, regression: bool, seed: int = 0) -> Path:
    """A prepared classification (or STS-B-like regression) dataset of tiny-vocabulary sentences; a few test
    sentences are longer than MAX_LEN tokens (the tokenize stage truncates them)."""
    from datasets import Dataset, DatasetDict

    rng = np.random.default_rng(seed)

    def split(name: str, n: int) -> Dataset:
        rows = {"id": [], "text_a": [], "label": []} | ({"text_b": []} if pair else {})
        for i in range(n):
            rows["id"].append(f"{name}-{i}")
            rows["text_a"].append(_sentence(rng, 50 if name == "test" and i < 2 else int(rng.integers(3, 14))))
            if pair:
                rows["text_b"].append(_sentence(rng, int(rng.integers(3, 12))))
            rows["label"].append(float(rng.integers(0, 6)) * BIN_WIDTH if regression else int(rng.integers(0, 2)))
        return Dataset.from_dict(rows)

    DatasetDict({"train": split("train", 8), "dev": split("dev", 24), "test": split("test", 24)}).save_to_disk(
        str(path))
    write_meta(path, {"name": path.name, "task_type": "regression" if regression else "classification",
                      "num_labels": 1 if regression else 2, "label_names": None if regression else ["neg", "pos"],
                      "text_fields": ["text_a", "text_b"] if pair else ["text_a"]})
    return path


def _student(meta: dict, model: dict, *, encoding: str, head: str | None, bin_width: float | None,
             seed: int = 0) -> tuple[torch.nn.Module, object, TaskSpec]:
    kind = meta["kind"]
    tok = meta["tokenizer"]
    num_labels = 6 if bin_width else (2 if kind == "classification" else 0)
    head_cfg = build(HeadConfig, {"type": head, "hidden_size": 16, "dropout": 0.0}, "head") if head else None
    task = TaskSpec(kind=kind, vocab_size=int(tok["vocab_size"]), max_seq_len=int(meta["max_seq_len"]),
                    pad_id=int(tok["pad_id"]), num_labels=num_labels, encoding=encoding, head=head_cfg,
                    bin_width=bin_width)
    cfg = build(CONFIGS[model["student"]], model, "model")
    torch.manual_seed(seed)
    student = build_student(cfg, task).eval()
    if model["student"] == "elmo":  # the word-vector table the loop copies in: random, special tokens zero as there
        student.input_vectors.normal_()
        student.input_vectors[[int(tok[k]) for k in ("pad_id", "cls_id", "sep_id", "mask_id")]] = 0.0
        if kind == "classification":  # a scalar mix far from its uniform start, so each layer's weight shows
            with torch.no_grad():
                student.head.mix.scalars.normal_()
                student.head.mix.gamma.fill_(1.5)
    return student, cfg, task


def make_run(root: Path, name: str, *, task: str, model: dict, encoding: str = "joint",
             head: str | None = "mlp") -> dict:
    """An evaluated run under ``root`` laid out as the pipeline does: models/students/<run>, data/tokens/<ds>,
    data/prepared/<ds>, models/teacher/<ds>, metrics/students/<run>.json, predictions/<run>.json, params.yaml.
    ``task``: ``classification`` (single sentences), ``regression`` (pairs) or ``qa``."""
    dataset = f"toy_{task}"
    prepared, tokens = root / "data" / "prepared" / dataset, root / "data" / "tokens" / dataset
    bins = 6 if task == "regression" else 2
    teacher = make_tiny_bert_dir(root / "models" / "teacher" / dataset, qa=task == "qa",
                                 num_labels=0 if task == "qa" else bins, seed=1)
    if task == "qa":
        made_prepared, made_tokens = make_qa_tokens(root, teacher, n_train=8, n_dev=16, n_test=16)
        prepared.parent.mkdir(parents=True, exist_ok=True)
        tokens.parent.mkdir(parents=True, exist_ok=True)
        made_prepared.rename(prepared)
        made_tokens.rename(tokens)
    else:
        make_prepared(prepared, pair=task == "regression", regression=task == "regression")
        cfg = TokenizeConfig(str(teacher), MAX_LEN, {dataset: TokenizeClassificationConfig("classification", None)})
        tokenize_dataset(dataset, prepared, cfg, tokens)
    return evaluated_run(root, name, prepared=prepared, tokens=tokens, teacher=teacher, model=model,
                         encoding=encoding, head=None if task == "qa" else head,
                         bin_width=BIN_WIDTH if task == "regression" else None)


def evaluated_run(root: Path, name: str, *, prepared: Path, tokens: Path, teacher: Path, model: dict, encoding: str,
                  head: str | None, bin_width: float | None) -> dict:
    """A student with random weights for the tokens, saved as training saves it, and the real evaluate stage's
    records of it beside its teacher (a model folder with the task's head)."""
    meta = read_meta(tokens)
    dataset = meta["name"]
    student, cfg, spec = _student(meta, model, encoding=encoding, head=head, bin_width=bin_width)
    record = {"name": name, "dataset": dataset, "kind": spec.kind, "metric": "accuracy", "steps": 12, "best_step": 8,
              "dev": None, "init": None, "tokens_fingerprint": meta["fingerprint"],
              "tokenizer_sha256": meta["tokenizer"]["sha256"], "note": f"a tiny {model['student']} for the tests",
              "trainable_params": sum(p.numel() for p in student.parameters()),
              "code": code_identity(stage_code(*CODE_STAGES, student=model["student"]))}
    student_dir = root / "models" / "students" / name
    save_student(student_dir, student, cfg, spec, record)
    run_entry = {"dataset": dataset, "model": model, "encoding": encoding, "head": None}
    params = {"finetune": {"runs": {name: run_entry}},
              "evaluate": {"device": "cpu", "batch_size": 8, "splits": ["dev", "test"],
                           "runs": {name: {"student": model["student"], "dataset": dataset, "teacher": dataset}}},
              "report": {"bootstrap": BOOTSTRAP, "tables": []}}
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    ecfg = build(EvaluateConfig, params["evaluate"], "evaluate")
    paths = {"metrics": root / "metrics" / "students" / f"{name}.json",
             "predictions": root / "predictions" / f"{name}.json"}
    evaluate_run(name, ecfg, ecfg.runs[name], student_dir=student_dir, tokens_dir=tokens, prepared_dir=prepared,
                 teacher_dir=teacher, out_path=paths["metrics"], predictions_path=paths["predictions"],
                 live_dir=root / "live" / name)
    return {"root": root, "run": name, "dataset": dataset, "student": student_dir, "tokens": tokens,
            "prepared": prepared, "teacher": teacher, "params": root / "params.yaml", "model": student,
            "task": spec, "config": dataclasses.asdict(cfg), **paths}


def export_kwargs(r: dict, out: Path, **over) -> dict:
    """export_run's keyword arguments for a run made by :func:`make_run`."""
    kw = {"out_dir": out, "student_dir": r["student"], "tokens_dir": r["tokens"], "metrics_path": r["metrics"],
          "predictions_path": r["predictions"], "speed_path": r["root"] / "metrics" / "speed" / f"{r['run']}.json",
          "params_path": r["params"], "root": r["root"],
          "license": "apache-2.0"}  # the tiny teachers have no model card to take a license from
    return kw | over
