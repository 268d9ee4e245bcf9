"""Tiny random BERT teachers (base, MLM, classification, QA) built in-process, token rows, and the
independent references the teacher tests compare against."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

VOCAB = 100
CLS, SEP, MASK = 2, 3, 4
N_LAYERS, N_HEADS, HIDDEN = 4, 4, 32


def tiny_config(**over):
    from transformers import BertConfig

    kw = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS,
              intermediate_size=64, max_position_embeddings=64, attn_implementation="eager")
    kw.update(over)
    return BertConfig(**kw)


def tiny_model(kind: str, seed: int = 0, **over):
    """A random tiny teacher in eval mode: kind in base, mlm, classification, qa."""
    import transformers

    cls = {"base": transformers.BertModel, "mlm": transformers.BertForMaskedLM,
           "classification": transformers.BertForSequenceClassification,
           "qa": transformers.BertForQuestionAnswering}[kind]
    torch.manual_seed(seed)
    cfg = tiny_config(**{"num_labels": 3, **over}) if kind == "classification" else tiny_config(**over)
    model = cls(cfg)
    # Random init gives near-constant scores and logits (~1e-2); spread them to a trained teacher's O(1)
    # range so that fp16 storage is judged on realistic values and top-k on a non-flat distribution.
    with torch.no_grad():
        for layer in model.base_model.encoder.layer:  # attention scores of O(1), not O(1e-2): a peaked softmax
            layer.attention.self.query.weight.normal_(0, 0.3)
            layer.attention.self.key.weight.normal_(0, 0.3)
        if kind == "mlm":
            model.cls.predictions.bias.normal_(0, 2.0)
        elif kind == "classification":
            model.classifier.weight.normal_(0, 1.0)
        elif kind == "qa":
            model.qa_outputs.weight.normal_(0, 0.3)
    return model.eval()


def save_teacher_dir(path: Path, model) -> Path:
    """save_pretrained layout with a WordPiece tokenizer over the tiny vocabulary."""
    from transformers import BertTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    vocab = path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(VOCAB - 5)])
                     + "\n")
    BertTokenizerFast(vocab=str(vocab), do_lower_case=True).save_pretrained(path)
    model.save_pretrained(path)
    return path


def make_rows(lengths, seed: int = 0, n_masked=None) -> list[dict]:
    """Token rows in the tokens-dataset format: [CLS] a [SEP] b [SEP], optional static MLM masks."""
    rng = np.random.default_rng(seed)
    rows = []
    for i, n in enumerate(lengths):
        ids = rng.integers(5, VOCAB, size=n).astype(np.int32)
        ids[0], ids[-1] = CLS, SEP
        split = max(1, n // 2)
        types = np.zeros(n, np.int8)
        if n >= 4:
            ids[split] = SEP
            types[split + 1:] = 1
        row = {"input_ids": ids.tolist(), "token_type_ids": types.tolist(), "length": int(n)}
        if n_masked is not None:
            k = min(n_masked[i], n - 2)
            pos = np.sort(rng.choice(np.arange(1, n - 1), size=k, replace=False)).astype(np.int32)
            row["masked_labels"] = ids[pos].tolist()
            ids[pos] = MASK
            row["input_ids"] = ids.tolist()
            row["masked_positions"] = pos.tolist()
        rows.append(row)
    return rows


def live_forward(model, batch):
    """The teacher's own fp32 outputs with every layer's hidden states and (eager) attentions."""
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                     attention_mask=batch["attention_mask"], output_hidden_states=True, output_attentions=True)


def manual_scores(model, hidden_states, j: int) -> torch.Tensor:
    """Pre-softmax scores of layer j recomputed from its input hidden state: Q K^T / sqrt(d_head)."""
    attn = model.base_model.encoder.layer[j - 1].attention.self
    h = hidden_states[j - 1]  # input of layer j
    B, L, d = h.shape
    H = model.config.num_attention_heads
    dh = d // H
    with torch.no_grad():
        q = torch.nn.functional.linear(h, attn.query.weight, attn.query.bias).reshape(B, L, H, dh)
        k = torch.nn.functional.linear(h, attn.key.weight, attn.key.bias).reshape(B, L, H, dh)
        return torch.einsum("bqhd,bkhd->bhqk", q, k) / dh ** 0.5


def spec_for(model, *, task: str = "none", mlm_topk: int = 0, hidden_layers=(), attn_layers=(),
             attn_probs_layers=(), pool: int = 1, embeddings: bool = False, max_seq_len: int | None = None,
             mlm_max_masked: int | None = None, hidden_rank: int = 0, attn_rank: int = 0):
    """A SignalSpec selecting these signals, with ``model``'s real sizes (hidden size, heads, vocabulary, classes),
    as :func:`distillpipe.teacher.cache.signal_spec` would build it for this teacher. ``max_seq_len`` defaults to
    the model's position limit and ``mlm_max_masked`` to ``max_seq_len``: the capture pads to neither unless
    asked (``seq_len``/``max_masked``)."""
    from distillpipe.store.schema import SignalSpec

    mc = model.config
    L = max_seq_len or mc.max_position_embeddings
    return SignalSpec(max_seq_len=L, pool=pool, task=task, n_classes=mc.num_labels if task == "classification" else 0,
                      vocab_size=mc.vocab_size, mlm_topk=mlm_topk,
                      mlm_max_masked=(mlm_max_masked or L) if mlm_topk else 0, hidden_layers=tuple(hidden_layers),
                      hidden_size=mc.hidden_size, attn_layers=tuple(attn_layers), n_heads=mc.num_attention_heads,
                      attn_probs_layers=tuple(attn_probs_layers), embedding_size=mc.hidden_size if embeddings else 0,
                      hidden_rank=hidden_rank, hidden_fit_rows=16 if hidden_rank else 0, attn_rank=attn_rank)


def constants_for(model, spec, rows=None):
    """The store constants a capture of ``spec`` needs, as the build makes them: the teacher's embedding tables, and
    subspaces fitted on ``rows`` (token row dicts) by the build's own fit."""
    from datasets import Dataset

    from distillpipe.store.constants import as_constants
    from distillpipe.teacher.fit import fit_constants

    data = Dataset.from_list(rows) if rows is not None else None
    arrays, info = fit_constants(model, data, spec, batch_size=4, pad_id=0)
    return as_constants(arrays, info, spec)
