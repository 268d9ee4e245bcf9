"""The MiniALBERT student (Nouriborji et al. 2022, "MiniALBERT: Model Distillation via Parameter-Efficient
Recursive Transformers", sec. 3.2-3.4, Fig. 2): one transformer layer applied recursively, with optional
per-iteration bottleneck adapters, on factorised embeddings.

Data flow (B rows of L tokens):

  ids, positions, token types -> embeddings of width r, LayerNorm          (B, L, r)    eq. (5): E = E_low W_e
  projection r -> d (only when r != d, as the authors' code)              (B, L, d)
  for i in 1..n_iterations:                                                            eq. (4)
      x = phi_att^i(O_{i-1})                 adapter (identity when adapter_size is 0)
      x = LN(x + Attn(x))                    f_att: the ONE shared attention sub-layer
      x = phi_mlp^i(x)                       adapter
      O_i = LN(x + FFN(x))                   f_mlp: the ONE shared feed-forward sub-layer  -> ``hidden[i-1]``,
                                                                                        ``attn_scores[i-1]``
  MLM: ALBERT's head (dense d -> r, GELU, LayerNorm) and a decoder tied to the r-wide token embeddings
  classification: the shared heads (``students/heads.py``) on O_n's first ([CLS]) position (the authors'
  MiniAlbertForSequenceClassification reads ``outputs[0][:, 0, :]``), joint or DiffCat encoding.

Adapters (eq. 3, phi(X) = W_up sigma(W_down X) + X) follow the authors' released ``BottleneckAdapter``: GELU
and a LayerNorm after the residual (LayerNorm(W_up GELU(W_down X) + X)); with d 768 and width 48 (reduction
factor 16) their 12 adapters hold 912,960 parameters, Table 1's "0.9M" tunable parameters of adapter tuning.
They live in ``adapters_att`` / ``adapters_mlp`` so that ``tune: adapters`` trains exactly them and the head.

Parameter count: independent of ``n_iterations`` except for the adapters (one layer, applied n times). The
paper's Table 1 sizes are checked in tests/students/test_minialbert.py. QA (span heads) is not implemented.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from distillpipe.config.students import MiniALBERTConfig
from distillpipe.students.base import StudentOutput, TaskSpec
from distillpipe.students.heads import build_head

N_TOKEN_TYPES = 2
"""Segment ids of BERT's joint encoding of a pair."""


class SelfAttention(nn.Module):
    """Multi-head self-attention written out, so that the pre-softmax scores can be returned."""

    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads = n_heads
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)
        self.dense = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` (B, L, d), ``key_mask`` (B, L) bool -> output (B, L, d), scores (B, H, L, L) before the mask."""
        B, L, d = x.shape
        H = self.n_heads
        q = self.query(x).view(B, L, H, d // H).transpose(1, 2)  # (B, H, L, dh)
        k = self.key(x).view(B, L, H, d // H).transpose(1, 2)  # (B, H, L, dh)
        v = self.value(x).view(B, L, H, d // H).transpose(1, 2)  # (B, H, L, dh)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // H))  # (B, H, L, L)
        # a finite fill, not -inf: a row without any real key stays finite
        att = scores.masked_fill(~key_mask[:, None, None, :], torch.finfo(scores.dtype).min)
        att = self.drop(F.softmax(att, dim=-1))  # (B, H, L, L)
        y = (att @ v).transpose(1, 2).reshape(B, L, d)  # (B, L, d)
        return self.dense(y), scores


class SharedLayer(nn.Module):
    """ALBERT's layer: f_att = LN(x + Attn(x)), f_mlp = LN(x + FFN(x)); its parameters are used by every iteration."""

    def __init__(self, cfg: MiniALBERTConfig):
        super().__init__()
        self.attention = SelfAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.ln_att = nn.LayerNorm(cfg.d_model, eps=1e-12)
        self.ffn = nn.Linear(cfg.d_model, cfg.d_ff)
        self.ffn_output = nn.Linear(cfg.d_ff, cfg.d_model)
        self.ln_mlp = nn.LayerNorm(cfg.d_model, eps=1e-12)
        self.drop = nn.Dropout(cfg.dropout)

    def f_att(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, scores = self.attention(x, mask)
        return self.ln_att(x + self.drop(a)), scores

    def f_mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln_mlp(x + self.drop(self.ffn_output(F.gelu(self.ffn(x)))))


class BottleneckAdapter(nn.Module):
    """Eq. (3), phi(X) = W_up sigma(W_down X) + X, with the authors' LayerNorm after the residual."""

    def __init__(self, d_model: int, size: int):
        super().__init__()
        self.down = nn.Linear(d_model, size)
        self.up = nn.Linear(size, d_model)
        self.ln = nn.LayerNorm(d_model, eps=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(self.up(F.gelu(self.down(x))) + x)


class MLMHead(nn.Module):
    """ALBERT's MLM head: dense d -> r, GELU, LayerNorm, then the r-wide token embeddings (tied) plus a bias."""

    def __init__(self, d_model: int, embedding_size: int, vocab_size: int):
        super().__init__()
        self.dense = nn.Linear(d_model, embedding_size)
        self.ln = nn.LayerNorm(embedding_size, eps=1e-12)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, x: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """``x`` (..., d), ``embedding`` (V, r) -> logits (..., V)."""
        return F.linear(self.ln(F.gelu(self.dense(x))), embedding, self.bias)


class MiniALBERT(nn.Module):
    """MiniALBERT for MLM (general distillation) and sequence(-pair) classification."""

    def __init__(self, cfg: MiniALBERTConfig, task: TaskSpec):
        super().__init__()
        if task.kind not in ("mlm", "classification"):
            raise ValueError(f"the MiniALBERT student handles tasks 'mlm' and 'classification', not {task.kind!r} "
                             "(no span head: use the waldorf student for QA)")
        if task.max_seq_len > cfg.max_position_embeddings:
            raise ValueError(f"the tokens hold rows of up to {task.max_seq_len} tokens but the MiniALBERT student has "
                             f"max_position_embeddings={cfg.max_position_embeddings}: raise max_position_embeddings "
                             "(a fine-tuning run must keep the value its init was general-distilled with) or "
                             "tokenize with a smaller max_seq_len")
        self.cfg, self.task = cfg, task
        r, d = cfg.embedding_size, cfg.d_model
        self.tok_emb = nn.Embedding(task.vocab_size, r)
        self.pos_emb = nn.Embedding(cfg.max_position_embeddings, r)
        self.type_emb = nn.Embedding(N_TOKEN_TYPES, r)
        self.ln_emb = nn.LayerNorm(r, eps=1e-12)
        self.drop = nn.Dropout(cfg.dropout)
        self.emb_proj = nn.Linear(r, d) if r != d else None  # eq. (5)'s W_e
        self.layer = SharedLayer(cfg)  # the one layer of eq. (2)
        if cfg.adapter_size:
            self.adapters_att = nn.ModuleList(BottleneckAdapter(d, cfg.adapter_size) for _ in range(cfg.n_iterations))
            self.adapters_mlp = nn.ModuleList(BottleneckAdapter(d, cfg.adapter_size) for _ in range(cfg.n_iterations))
        if task.kind == "mlm":
            self.mlm_head = MLMHead(d, r, task.vocab_size)
        else:
            assert task.head is not None  # TaskSpec guarantees it for classification
            self.head = build_head(task.head, d, task.num_labels, token_features=d, matrix_side=None,
                                   pairs=task.encoding == "diffcat")
        self.apply(self._init)

    def _init(self, m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=self.cfg.init_std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def encode(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor | None
               ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(outputs O_1..O_n, each (B, L, d); pre-softmax scores of each iteration, each (B, H, L, L))."""
        L = ids.shape[1]
        if L > self.cfg.max_position_embeddings:
            raise ValueError(f"batch length {L} exceeds the MiniALBERT student's max_position_embeddings "
                             f"{self.cfg.max_position_embeddings}")
        if types is None:
            types = torch.zeros_like(ids)
        pos = torch.arange(L, device=ids.device)
        x = self.drop(self.ln_emb(self.tok_emb(ids) + self.pos_emb(pos)[None] + self.type_emb(types)))  # (B, L, r)
        if self.emb_proj is not None:
            x = self.emb_proj(x)  # (B, L, d)
        hidden, scores = [], []
        for i in range(self.cfg.n_iterations):  # eq. (4); eq. (2) without adapters
            if self.cfg.adapter_size:
                x = self.adapters_att[i](x)
            x, s = self.layer.f_att(x, mask)  # (B, L, d), (B, H, L, L)
            if self.cfg.adapter_size:
                x = self.adapters_mlp[i](x)
            x = self.layer.f_mlp(x)  # (B, L, d)
            hidden.append(x)
            scores.append(s)
        return hidden, scores

    def forward(self, batch: dict[str, torch.Tensor], *, return_hidden: bool = False) -> StudentOutput:
        """``return_hidden`` is accepted for the student contract; every iteration's output and scores are
        by-products of the forward and always returned (joint encoding)."""
        if self.task.encoding == "diffcat":
            # DiffCat (CMOW paper sec. III-C): each sequence encoded alone; the head classifies [a, |a-b|, b].
            # No per-layer states: the teacher's belong to the joint sequence, never encoded here.
            a_mask, b_mask = batch["a_attention_mask"].bool(), batch["b_attention_mask"].bool()
            a = self.encode(batch["a_input_ids"], a_mask, None)[0][-1]  # (B, La, d)
            b = self.encode(batch["b_input_ids"], b_mask, None)[0][-1]  # (B, Lb, d)
            return StudentOutput(logits=self.head(a[:, 0], a, a_mask, pair=(b[:, 0], b, b_mask)))

        mask = batch["attention_mask"].bool()  # (B, L)
        hidden, scores = self.encode(batch["input_ids"], mask, batch.get("token_type_ids"))
        common = {"hidden": tuple(hidden), "hidden_stride": 1, "attn_scores": tuple(scores)}
        last = hidden[-1]  # (B, L, d)
        if self.task.kind == "mlm":
            positions = batch["mlm_positions"]  # (B, M), -1 = unused slot
            at = last.gather(1, positions.clamp(min=0)[..., None].expand(-1, -1, last.shape[-1]))  # (B, M, d)
            return StudentOutput(mlm_logits=self.mlm_head(at, self.tok_emb.weight), **common)
        return StudentOutput(logits=self.head(last[:, 0], last, mask), **common)
