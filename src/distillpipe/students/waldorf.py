"""The WaLDORf student (Tian et al. 2019, "WaLDORf: Wasteless Language-model Distillation On
Reading-comprehension", sec. 3.2, Fig. 1, Table 1): convolutions shrink the sequence 4x, transformer
blocks run on the short sequence (1/16th of the attention work), convolutions expand it back.

Data flow (shapes for a batch of B rows of L tokens; L is padded inside to Lp = 4 * ceil(L / 4)):

  ids, positions, token types -> embeddings, LayerNorm            (B, L, e)     ``embeddings`` (eq. 1)
  conv_1 (e -> c1 filters), GELU, max-pool 2                     (B, Lp/2, c1)
  conv_2 (c1 -> c2 filters), GELU, max-pool 2                    (B, Lp/4, c2)
  time-distributed linear expansion c2 -> d_model                (B, Lp/4, d)
  n_layers BERT (post-LN) transformer blocks                     (B, Lp/4, d)  ``hidden[j]``, ``attn_scores[j]``
  up stage 1: u = up-sample 2 (repeat); LayerNorm(u + conv_5(GELU(conv_3(u))))   (B, Lp/2, d)
  up stage 2: u = up-sample 2 (repeat); LayerNorm(u + conv_6(GELU(conv_4(u))))   (B, Lp, d)
  crop to L, QA head: linear d -> 2                              start/end logits (B, L)

The paper's Table 1 names the filters (conv_1: 96, conv_2: 192, conv_3-6: 480 = d_model) and counts four
decoder convolutions; Fig. 1's caption says "Conv_3 and Conv_4 layers are paired with up sampling" and
"Skip connections are used after up sampling layers to skip past convolutional layers but before layer
normalization". We read that as above: each up-sampling stage has two convolutions (the first of
them is the one paired with the up-sampling), and its skip connection runs from the up-sampled
tensor around both convolutions into the stage's LayerNorm. There is no skip from the down-sampling
side: the paper's point is that every ~4 word pieces share one "smeared out" representation. The
expansion to d_model sits right before the blocks (sec. 3.2: "Before feeding data into the 8 encoder
blocks, we use a time-distributed feed-forward layer to expand the dimensions"), after conv_2, which
is what Table 1's conv_1/conv_2 filter counts (96, 192) imply. Up-sampling repeats each position
(the paper: "since there are no transposed convolutions in 1 dimension", i.e. Keras' UpSampling1D);
the kernel width and the activations are not given (``conv_kernel``; GELU as in BERT).

Padding: padded tokens are zeroed before every convolution and kept out of every max-pool, and a
pooled position is real when any of its 2 (4) tokens is (the teacher's ``pooled_mask``), so a row's
outputs on its real positions do not depend on how much padding its batch has.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from distillpipe.config.students import WaLDORfConfig
from distillpipe.students.base import StudentOutput, TaskSpec
from distillpipe.students.heads import build_head

STRIDE = 4
"""Sequence positions per transformer-block position (two max-pools of 2)."""
N_TOKEN_TYPES = 2
"""Segment ids of BERT's joint encoding (question / context)."""


def _pool_mask(mask: torch.Tensor) -> torch.Tensor:
    """(B, L) -> (B, L/2): a pooled position is real if either of its two positions is."""
    B, L = mask.shape
    return mask.view(B, L // 2, 2).any(dim=2)


class SelfAttention(nn.Module):
    """Multi-head self-attention written out, so that the pre-softmax scores can be returned."""

    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` (B, n, d), ``key_mask`` (B, n) bool -> output (B, n, d) and scores (B, H, n, n).

        The scores are q.k / sqrt(d_head) before masking and softmax (the quantity WaLDORf eq. (4)
        distils); the attention probabilities are their softmax over the real keys.
        """
        B, n, d = x.shape
        H = self.n_heads
        q, k, v = self.qkv(x).split(d, dim=2)
        q = q.view(B, n, H, d // H).transpose(1, 2)  # (B, H, n, dh)
        k = k.view(B, n, H, d // H).transpose(1, 2)  # (B, H, n, dh)
        v = v.view(B, n, H, d // H).transpose(1, 2)  # (B, H, n, dh)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // H))  # (B, H, n, n)
        # a finite fill, not -inf: a row without any real key (an all-padding row) stays finite
        att = scores.masked_fill(~key_mask[:, None, None, :], torch.finfo(scores.dtype).min)
        att = self.drop(F.softmax(att, dim=-1))  # (B, H, n, n)
        y = (att @ v).transpose(1, 2).reshape(B, n, d)  # (B, n, d)
        return self.proj(y), scores


class Block(nn.Module):
    """A BERT encoder block (post-LayerNorm), as the paper uses ("the standard transformer encoder blocks")."""

    def __init__(self, cfg: WaLDORfConfig):
        super().__init__()
        self.attn = SelfAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.ffn = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model))
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, scores = self.attn(x, mask)
        x = self.ln_1(x + self.drop(a))
        x = self.ln_2(x + self.drop(self.ffn(x)))
        return x, scores


class DownStage(nn.Module):
    """conv ('same' padding), GELU, max-pool 2 over real positions only: (B, C_in, L) -> (B, C_out, L/2)."""

    def __init__(self, c_in: int, c_out: int, kernel: int):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, padding=kernel // 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.gelu(self.conv(x.masked_fill(~mask[:, None, :], 0.0)))  # (B, C_out, L)
        x = F.max_pool1d(x.masked_fill(~mask[:, None, :], float("-inf")), 2)  # (B, C_out, L/2)
        pooled = _pool_mask(mask)  # (B, L/2)
        return x.masked_fill(~pooled[:, None, :], 0.0), pooled  # all-padding pairs: 0, not -inf


class UpStage(nn.Module):
    """Up-sample 2 (repeat), two convolutions, skip from the up-sampled input, LayerNorm (Fig. 1):
    (B, d, n) -> (B, d, 2n)."""

    def __init__(self, d: int, kernel: int, dropout: float):
        super().__init__()
        self.conv_a = nn.Conv1d(d, d, kernel, padding=kernel // 2)  # conv_3 / conv_4: paired with up-sampling
        self.conv_b = nn.Conv1d(d, d, kernel, padding=kernel // 2)  # conv_5 / conv_6
        self.ln = nn.LayerNorm(d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``x`` (B, d, n), ``mask`` (B, 2n) bool at the output length."""
        invalid = ~mask[:, None, :]
        u = x.repeat_interleave(2, dim=2).masked_fill(invalid, 0.0)  # (B, d, 2n)
        c = F.gelu(self.conv_a(u)).masked_fill(invalid, 0.0)  # (B, d, 2n)
        c = self.conv_b(c)  # (B, d, 2n)
        return self.ln((u + self.drop(c)).transpose(1, 2)).transpose(1, 2)  # (B, d, 2n)


class WaLDORf(nn.Module):
    """WaLDORf student for extractive QA (start/end logits); also sequence classification through a
    shared head (``students/heads.py``: linear, mlp on the masked mean of the last block's output, bilstm
    over its positions; then no up-sampling stages are built)."""

    def __init__(self, cfg: WaLDORfConfig, task: TaskSpec):
        super().__init__()
        if task.kind not in ("qa", "classification"):
            raise ValueError(
                f"the WaLDORf student handles tasks 'qa' and 'classification', not {task.kind!r}: "
                "for MLM corpora use a student with an MLM head (cmow_hybrid)"
            )
        if task.encoding != "joint":
            raise ValueError("the WaLDORf student reads the joint (BERT) encoding of pairs; set encoding: joint")
        self.cfg, self.task = cfg, task
        e, d = cfg.embedding_size, cfg.d_model
        c1, c2 = cfg.conv_channels
        # factorised embeddings of width e (ALBERT-like, sec. 3.2)
        self.tok_emb = nn.Embedding(task.vocab_size, e)
        self.pos_emb = nn.Embedding(task.max_seq_len, e)
        self.type_emb = nn.Embedding(N_TOKEN_TYPES, e)
        self.ln_emb = nn.LayerNorm(e)
        self.drop = nn.Dropout(cfg.dropout)
        self.down_1 = DownStage(e, c1, cfg.conv_kernel)  # conv_1 + max-pool
        self.down_2 = DownStage(c1, c2, cfg.conv_kernel)  # conv_2 + max-pool
        self.expand = nn.Linear(c2, d)  # time-distributed: the same matrix at every position
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        if task.kind == "qa":
            self.up_1 = UpStage(d, cfg.conv_kernel, cfg.dropout)
            self.up_2 = UpStage(d, cfg.conv_kernel, cfg.dropout)
            self.head = nn.Linear(d, 2)  # start, end
        else:
            assert task.head is not None  # TaskSpec guarantees it for classification
            # the sequence encoding is the masked mean of the last block; 'bilstm' reads the block's positions
            self.head = build_head(task.head, d, task.num_labels, token_features=d, matrix_side=None, pairs=False)
        self.apply(self._init)

    def _init(self, m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Embedding)):
            nn.init.normal_(m.weight, std=self.cfg.init_std)
        if isinstance(m, (nn.Linear, nn.Conv1d)) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, batch: dict[str, torch.Tensor], *, return_hidden: bool = False) -> StudentOutput:
        """``return_hidden`` is accepted for the student contract; the block outputs and scores are
        by-products of the forward and always returned."""
        ids = batch["input_ids"]
        L = ids.shape[1]
        if L > self.task.max_seq_len:
            raise ValueError(f"batch length {L} exceeds the student's max_seq_len {self.task.max_seq_len}")
        mask = batch["attention_mask"].bool()  # (B, L)
        types = batch.get("token_type_ids")
        if types is None:
            types = torch.zeros_like(ids)
        pos = torch.arange(L, device=ids.device)
        emb = self.ln_emb(self.tok_emb(ids) + self.pos_emb(pos)[None] + self.type_emb(types))  # (B, L, e)

        # ceil(L / 4) with a positive floor division: torch.onnx translates // to ONNX's truncating Div, which is
        # floor only for non-negative operands (-(-L // 4) exports as floor(L / 4))
        Lp = STRIDE * ((L + STRIDE - 1) // STRIDE)
        x = F.pad(self.drop(emb), (0, 0, 0, Lp - L)).transpose(1, 2)  # (B, e, Lp)
        mask_1 = F.pad(mask, (0, Lp - L), value=False)  # (B, Lp)
        x, mask_2 = self.down_1(x, mask_1)  # (B, c1, Lp/2), (B, Lp/2)
        x, mask_4 = self.down_2(x, mask_2)  # (B, c2, Lp/4), (B, Lp/4)
        x = self.drop(self.expand(x.transpose(1, 2)))  # (B, Lp/4, d)

        hidden, scores = [], []
        for block in self.blocks:
            x, s = block(x, mask_4)  # (B, Lp/4, d), (B, H, Lp/4, Lp/4)
            hidden.append(x)
            scores.append(s)
        common = {"hidden": tuple(hidden), "hidden_stride": STRIDE, "attn_scores": tuple(scores), "embeddings": emb}

        if self.task.kind == "classification":
            m = mask_4[..., None].to(x.dtype)  # (B, Lp/4, 1)
            pooled = (x * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)  # (B, d) mean over real positions
            return StudentOutput(logits=self.head(pooled, x, mask_4), **common)

        x = self.up_1(x.transpose(1, 2), mask_2)  # (B, d, Lp/2)
        x = self.up_2(x, mask_1)  # (B, d, Lp)
        logits = self.head(x.transpose(1, 2)[:, :L])  # (B, L, 2)
        start, end = logits.unbind(dim=-1)  # (B, L) each
        return StudentOutput(start_logits=start, end_logits=end, **common)
