"""The ``qg_finetune`` stage: fine-tune T5 on (context [+ answer hint] -> question) pairs (WaLDORf
sec. 3.4: T5 : C -> Q on the SQuAD v2 training set).

Pairs come from the answerable rows of a prepared QA dataset (train for training, dev for the dev
loss and a few sample generations). The embedded default builds a small T5 from config with a
SentencePiece vocabulary trained here on the train contexts and questions; a preset fine-tunes a
pretrained T5 (``t5-large``, ``google/flan-t5-base``) with its own tokenizer. Training resumes from
its checkpoints (model, optimizer, scheduler, RNG, position in the epoch) to the same weights as an
uninterrupted run. Output: the model and tokenizer in save_pretrained layout, ``qg.json`` (the input
format, params, dev metrics, samples) and a metrics JSON.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distillpipe.assets import resolve_model, tokenizer_sha256, weights_sha256
from distillpipe.checkpoints import Checkpointer, resume_or_restart
from distillpipe.config.decoding import GreedyDecodingConfig
from distillpipe.config.qg_finetune import QgFinetuneConfig, QgPretrainedModelConfig, QgScratchModelConfig
from distillpipe.data.batching import length_batches, pad_sequences
from distillpipe.data.schema import read_meta
from distillpipe.identity import json_sha256, sha256_dir, sha256_file, stage_code
from distillpipe.progress import Progress
from distillpipe.qg import QgError
from distillpipe.qg.generate import decoding_kwargs, generate_questions
from distillpipe.qg.model import QG_META, load_pretrained_t5, source_text
from distillpipe.qg.vocab import SPM_FILE, load_spm_tokenizer, train_sentencepiece
from distillpipe.runtime import adamw, autocast, resolve_device, rng_state, seed_everything, set_rng_state

log = logging.getLogger(__name__)
CODE_STAGE = "qg_finetune"
"""The stage whose whole import closure is the code part of a checkpoint's identity."""
FORMAT_VERSION = 1
IGNORE = -100  # label id that the loss skips (padding)


def build_scratch_t5(cfg: QgScratchModelConfig, vocab_size: int):
    """A randomly initialised ``T5ForConditionalGeneration`` (seed the RNG first) with T5's id conventions:
    <pad> = 0 (also the decoder start token), </s> = 1."""
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=vocab_size, d_model=cfg.d_model, d_kv=cfg.d_kv, d_ff=cfg.d_ff, num_layers=cfg.n_encoder_layers,
        num_decoder_layers=cfg.n_decoder_layers, num_heads=cfg.n_heads,
        relative_attention_num_buckets=cfg.relative_attention_num_buckets,
        relative_attention_max_distance=cfg.relative_attention_max_distance, dropout_rate=cfg.dropout,
        feed_forward_proj=cfg.feed_forward_proj, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    return T5ForConditionalGeneration(config)


@dataclass
class Pairs:
    """Tokenized (source, target) pairs of one split, with the texts they came from."""

    sources: list[list[int]]
    targets: list[list[int]]
    source_texts: list[str]
    contexts: list[str]
    questions: list[str]
    dropped: dict[str, int] = field(default_factory=dict)
    """Rows left out, by reason; ``questions truncated`` counts kept rows whose question was cut."""

    def __len__(self) -> int:
        return len(self.sources)


@dataclass
class QgSummary:
    train_pairs: int
    dev_pairs: int
    dropped: dict[str, int]
    vocab_size: int
    steps: int
    seconds: float
    metrics: dict[str, float]

    def one_line(self) -> str:
        drops = ", ".join(f"{n:,} {r}" for r, n in self.dropped.items() if n) or "none"
        return (f"qg_finetune: {self.train_pairs:,} train pairs (train rows left out: {drops}), vocab "
                f"{self.vocab_size:,}, {self.steps} steps, {self.seconds:.1f} s; dev loss "
                f"{self.metrics['dev_loss']:.3f}, token accuracy {self.metrics['dev_token_accuracy']:.3f}")


def encode_pairs(tok: Any, split: Any, cfg: QgFinetuneConfig) -> Pairs:
    """Answerable rows of a prepared QA split -> token ids of sources and targets.

    A source is cut to ``max_source_len`` tokens (</s> kept); a pair whose answer ends beyond the cut
    is dropped, since its question is about text the model would not see. Questions are cut to
    ``max_target_len`` tokens.
    """
    contexts, questions, sources, answer_ends = [], [], [], []
    unanswerable = 0
    for context, question, answers in zip(split["context"], split["question"], split["answers"]):
        if not answers["text"]:
            unanswerable += 1
            continue
        answer = answers["text"][0]
        source = source_text(context, answer if cfg.answer_hint else None)
        contexts.append(context)
        questions.append(question)
        sources.append(source)
        # the context ends the source: its answer ends this many chars into the source
        answer_ends.append(len(source) - len(context) + answers["answer_start"][0] + len(answer))
    pairs = Pairs([], [], [], [], [], {"unanswerable rows": unanswerable, "answers beyond max_source_len": 0,
                                   "questions truncated": 0})
    if not sources:
        return pairs
    enc = tok(sources, return_offsets_mapping=True)
    targets = tok(questions, return_attention_mask=False)["input_ids"]
    eos, n_src, n_tgt = tok.eos_token_id, cfg.max_source_len, cfg.max_target_len
    for i, ids in enumerate(enc["input_ids"]):
        if len(ids) > n_src:
            visible_end = enc["offset_mapping"][i][n_src - 2][1]  # char end of the last kept token
            if answer_ends[i] > visible_end:
                pairs.dropped["answers beyond max_source_len"] += 1
                continue
            ids = ids[: n_src - 1] + [eos]
        target = targets[i]
        if len(target) > n_tgt:
            target = target[: n_tgt - 1] + [eos]
            pairs.dropped["questions truncated"] += 1
        pairs.sources.append(ids)
        pairs.targets.append(target)
        pairs.source_texts.append(sources[i])
        pairs.contexts.append(contexts[i])
        pairs.questions.append(questions[i])
    return pairs


def collate_pairs(pairs: Pairs, idx: list[int], pad_id: int) -> dict[str, torch.Tensor]:
    input_ids = pad_sequences([pairs.sources[i] for i in idx], pad_id)  # (B, S)
    labels = pad_sequences([pairs.targets[i] for i in idx], IGNORE)  # (B, T)
    return {"input_ids": input_ids, "attention_mask": (input_ids != pad_id).long(), "labels": labels}


def _tokenizer(cfg: QgFinetuneConfig, train: Any, base_dir: Path | None, work: Path) -> tuple[Any, str]:
    """The tokenizer and its sha256: a SentencePiece model trained on the train texts (scratch) or the
    pretrained model's own."""
    if isinstance(cfg.model, QgScratchModelConfig):
        texts = list(dict.fromkeys(train["context"])) + list(train["question"])
        size = train_sentencepiece(texts, cfg.model.vocab_size, cfg.model.character_coverage, work / SPM_FILE)
        log.info("SentencePiece unigram vocabulary: %d pieces from %d texts", size, len(texts))
        return load_spm_tokenizer(work), sha256_file(work / SPM_FILE)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(base_dir), tokenizer_sha256(base_dir)


def finetune_qg(prepared_dir: str | Path, cfg: QgFinetuneConfig, out_dir: str | Path, ckpt_dir: str | Path,
                metrics_path: str | Path) -> QgSummary:
    """Fine-tune the question generator on the QA set in ``prepared_dir``; write it to ``out_dir``."""
    from datasets import DatasetDict, load_from_disk
    from transformers import get_linear_schedule_with_warmup

    t0 = time.time()
    prepared_dir, out_dir, ckpt_dir = Path(prepared_dir), Path(out_dir), Path(ckpt_dir)
    base_dir = None
    if isinstance(cfg.model, QgPretrainedModelConfig):
        base_dir = resolve_model(cfg.model.base)  # first: offline, a hub name fails within seconds
    meta = read_meta(prepared_dir)
    if meta.get("task_type") != "qa":
        raise QgError(f"{prepared_dir} holds a {meta.get('task_type')!r} dataset; qg_finetune needs a QA set "
                      "(SQuAD-v2 format: context, question, answers)")
    data = load_from_disk(str(prepared_dir))
    if not isinstance(data, DatasetDict) or not {"train", "dev"} <= set(data):
        raise QgError(f"{prepared_dir} needs a train and a dev split (has {list(data)})")
    device = resolve_device(cfg.device)

    with tempfile.TemporaryDirectory(prefix="qg-vocab-") as work:
        tok, tok_sha = _tokenizer(cfg, data["train"], base_dir, Path(work))
        train, dev = encode_pairs(tok, data["train"], cfg), encode_pairs(tok, data["dev"], cfg)
        if not len(train) or not len(dev):
            raise QgError(f"{prepared_dir}: no usable answerable pairs in train ({len(train)}) or dev ({len(dev)}); "
                          f"left out: {train.dropped} / {dev.dropped}. Raise qg_finetune.max_source_len?")
        rows = np.arange(len(train))
        if cfg.max_train_rows is not None and len(train) > cfg.max_train_rows:
            rows = np.sort(np.random.default_rng(cfg.seed).permutation(len(train))[: cfg.max_train_rows])
        log.info("qg pairs: %d train (%d used), %d dev; left out %s", len(train), len(rows), len(dev), train.dropped)

        seed_everything(cfg.seed)
        if isinstance(cfg.model, QgScratchModelConfig):
            model = build_scratch_t5(cfg.model, len(tok))
        else:
            model, _ = load_pretrained_t5(base_dir)
        model.to(device)
        pad_id = tok.pad_token_id
        no_decay = ("bias", "layer_norm.weight")
        groups = [
            {"params": [p for n, p in model.named_parameters() if not n.endswith(no_decay)],
             "weight_decay": cfg.weight_decay},
            {"params": [p for n, p in model.named_parameters() if n.endswith(no_decay)], "weight_decay": 0.0},
        ]
        optimizer = adamw(groups, lr=cfg.lr)
        steps_per_epoch = math.ceil(len(rows) / cfg.batch_size)
        total = steps_per_epoch * cfg.epochs
        scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_fraction * total), total)

        # Resume only a run of the same params, data and vocabulary; anything else starts over, saying so.
        run_id = json_sha256({"format": FORMAT_VERSION, "cfg": dataclasses.asdict(cfg), "tokenizer": tok_sha,
                              "data": sha256_dir(prepared_dir, ["*.arrow"]),
                              "base": weights_sha256(base_dir) if base_dir is not None else None,
                              "code": stage_code(CODE_STAGE), "device": device.type})
        epoch, step_in_epoch, step = 0, 0, 0
        state = resume_or_restart(ckpt_dir, run_id, key="run_id", covers="params, data, vocabulary, code or device")
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            set_rng_state(state["rng"])
            epoch, step_in_epoch, step = state["epoch"], state["step_in_epoch"], state["step"]
            log.info("resuming qg_finetune at epoch %d, step %d/%d", epoch, step, total)

        # By the clock, in the background (checkpoints.py); none at the end: the model is saved right after.
        checkpoints = Checkpointer(ckpt_dir, cfg.checkpoint_minutes)

        def checkpoint():
            checkpoints.save(step, {
                "run_id": run_id, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "rng": rng_state(), "epoch": epoch,
                "step_in_epoch": step_in_epoch, "step": step})

        lengths = np.array([len(train.sources[i]) for i in rows])
        bar = Progress(total=total, initial=step, desc="qg_finetune", unit="step")
        model.train()
        while epoch < cfg.epochs:
            batches = length_batches(lengths, cfg.batch_size, shuffle=True, seed=cfg.seed * 1000 + epoch)
            for b in batches[step_in_epoch:]:
                batch = {k: v.to(device) for k, v in collate_pairs(train, rows[b].tolist(), pad_id).items()}
                with autocast(device):
                    loss = model(**batch).loss  # mean cross-entropy over question tokens
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                step_in_epoch += 1
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}")
                if checkpoints.due():
                    checkpoint()
            epoch, step_in_epoch = epoch + 1, 0
        bar.close()
        checkpoints.wait()  # a write still in flight: on disk (or its error raised) before the model is scored

        metrics = dev_metrics(model, dev, pad_id, device, cfg.batch_size)
        samples = sample_generations(model, tok, dev, cfg, device)
        for s in samples:
            log.info("sample: %s\n  reference: %s\n  generated: %s", s["context"][:100], s["reference"], s["generated"])
        report = {"train_pairs": len(rows), "dev_pairs": len(dev), "steps": step, "vocab_size": len(tok), **metrics}
        qg_meta = {"format": FORMAT_VERSION,
                   "input_format": source_text("<context>", "<answer>" if cfg.answer_hint else None),
                   "answer_hint": cfg.answer_hint, "max_source_len": cfg.max_source_len,
                   "max_target_len": cfg.max_target_len, "params": dataclasses.asdict(cfg),
                   "train_left_out": train.dropped, "dev": report, "samples": samples}
        _save(model, tok, Path(work) if isinstance(cfg.model, QgScratchModelConfig) else None, out_dir, qg_meta)
    metrics_path = Path(metrics_path)
    metrics_path.parent.mkdir(parents=True, exist_ok=True)
    metrics_path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    checkpoints.clear()  # the model is saved: a resume point is no longer needed
    return QgSummary(len(rows), len(dev), train.dropped, len(tok), step, time.time() - t0, metrics)


@torch.inference_mode()
def dev_metrics(model: Any, pairs: Pairs, pad_id: int, device: torch.device, batch_size: int) -> dict[str, float]:
    """Token-weighted dev cross-entropy and teacher-forced next-token accuracy over the questions."""
    was_training = model.training
    model.eval()
    loss_sum, correct, tokens = 0.0, 0, 0
    for idx in length_batches([len(s) for s in pairs.sources], batch_size):
        batch = {k: v.to(device) for k, v in collate_pairs(pairs, idx.tolist(), pad_id).items()}
        with autocast(device):
            logits = model(**batch).logits.float()  # (B, T, V)
        labels = batch["labels"]  # (B, T)
        loss_sum += torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, ignore_index=IGNORE,
                                                      reduction="sum").item()
        mask = labels != IGNORE
        correct += int((logits.argmax(-1).eq(labels) & mask).sum())
        tokens += int(mask.sum())
    model.train(was_training)
    return {"dev_loss": loss_sum / tokens, "dev_token_accuracy": correct / tokens}


def sample_generations(model: Any, tok: Any, dev: Pairs, cfg: QgFinetuneConfig, device: torch.device) -> list[dict]:
    """Greedy questions for the first ``cfg.samples`` dev contexts, beside their references."""
    n = min(cfg.samples, len(dev))
    if n == 0:
        return []
    kw = decoding_kwargs(GreedyDecodingConfig(kind="greedy"), 1, cfg.max_target_len, 0)
    out, _ = generate_questions(model, tok, dev.source_texts[:n], kw, batch_size=cfg.batch_size,
                                max_source_len=cfg.max_source_len, device=device, seed=(cfg.seed,))
    return [{"context": c, "reference": q, "generated": g[0]} for c, q, g in zip(dev.contexts, dev.questions, out)]


def _save(model: Any, tok: Any, spm_dir: Path | None, out_dir: Path, qg_meta: dict[str, Any]) -> None:
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if spm_dir is not None:  # the SentencePiece model itself, for tools that read .model files
        shutil.copy2(spm_dir / SPM_FILE, tmp / SPM_FILE)
    (tmp / QG_META).write_text(json.dumps(qg_meta, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                               encoding="utf-8")
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out_dir)
