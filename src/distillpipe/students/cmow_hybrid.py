"""The bidirectional CMOW/CBOW-Hybrid student (CMOW paper, sec. III-A to III-C).

Each token j has a d x d matrix per direction (``X_fw``, and ``X_bw`` when bidirectional) and a d_vec
vector (``x_cbow``); all three are ``nn.Embedding`` tables. A sequence is encoded by ordered matrix
products (CMOW, order-aware) and vector sums (CBOW):

    token i (paper, eq. "Bidi. Hybrid", H_i):  flat(X_1..X_i) || flat(X_n..X_i) || sum_{j<=i} x_j || sum_{j>=i} x_j
    sequence (paper, full-sequence eq.):       flat(X_1..X_n) || flat(X_n..X_1) || sum_j x_j

(the backward parts only when bidirectional; the CMOW or CBOW parts only for the ``cmow`` / ``cbow``
variants). Products run as associative scans of depth O(log n) (:mod:`distillpipe.students.scan`).

Padding is taken from ``attention_mask``: pad positions are identity matrices and zero vectors, so they
change no product or sum wherever they sit, and each row's backward states start at its own last token.
Token representations at pad positions are zero. ``token_type_ids`` are not used (CMOW has no segments).

Heads: a linear MLM head ``mlm_head`` (paper Fig. 1) for kind 'mlm', reading the context of each masked
position (token i left out: P_{i-1}, S_{i+1}, ...; see :meth:`CMOWHybrid.context_reps` for why), while
``hidden`` holds H_i; for 'classification' a head from
:mod:`distillpipe.students.heads` under ``head``, on the joint encoding or on DiffCat [a, |a-b|, b] of
separately encoded sequences (sec. III-C). QA is not supported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from distillpipe.config.students import CMOWHybridConfig
from distillpipe.students.base import StudentOutput, TaskSpec
from distillpipe.students.heads import build_head
from distillpipe.students.scan import prefix_products, suffix_products, tree_product


@dataclass
class Encoding:
    """What :meth:`CMOWHybrid.encode` returns for one batch of sequences."""

    seq: torch.Tensor
    """(B, D_seq) sequence encoding."""
    tokens: torch.Tensor | None
    """(B, L, D_tok) per-token representations H_i (zero at pad positions); None when not asked for."""
    scans: dict[str, torch.Tensor]
    """The unflattened parts ``tokens`` was built from (prefix/suffix products, CBOW vectors and prefix
    sums), for the MLM context representations; empty when ``tokens`` is None."""


class CMOWHybrid(nn.Module):
    """Bidirectional CMOW/CBOW-Hybrid matrix-embedding student; see the module docstring."""

    def __init__(self, cfg: CMOWHybridConfig, task: TaskSpec) -> None:
        super().__init__()
        if task.kind == "qa":
            raise ValueError(
                "CMOW/CBOW-Hybrid has no QA (span) head: train it on 'mlm' or 'classification' "
                "tasks, or pick the 'waldorf' student for QA"
            )
        self.cfg, self.task = cfg, task
        self.use_cmow = cfg.variant in ("cmow", "hybrid")
        self.use_cbow = cfg.variant in ("cbow", "hybrid")
        self.n_dir = 2 if cfg.bidirectional else 1
        d, V = cfg.d, task.vocab_size

        if self.use_cmow:
            # Paper sec. III-A: each matrix starts as I_d + N(0, init_std^2).
            self.X_fw = self._matrix_table(V, d, cfg.init_std)
            self.X_bw = self._matrix_table(V, d, cfg.init_std) if cfg.bidirectional else None
        if self.use_cbow:
            self.x_cbow = nn.Embedding(V, cfg.d_vec)
            # The authors' code (seq2mat `_init_weights`) draws every nn.Embedding from N(0, initializer_range^2),
            # the same 0.01 as the matrices' noise; so does this, with init_std.
            nn.init.normal_(self.x_cbow.weight, mean=0.0, std=cfg.init_std)
        self.dropout = nn.Dropout(cfg.dropout)

        self.seq_features = self.n_dir * d * d * self.use_cmow + cfg.d_vec * self.use_cbow
        self.token_features = self.n_dir * (d * d * self.use_cmow + cfg.d_vec * self.use_cbow)

        if task.kind == "mlm":
            self.mlm_head = nn.Linear(self.token_features, V)  # linear MLM head (paper Fig. 1)
        else:
            assert task.head is not None  # TaskSpec guarantees a head config for classification
            self.head = build_head(
                task.head,
                self.seq_features,
                task.num_labels,
                token_features=self.token_features,
                matrix_side=d if self.use_cmow else None,
                pairs=task.encoding == "diffcat",
            )

    @staticmethod
    def _matrix_table(vocab: int, d: int, init_std: float) -> nn.Embedding:
        table = nn.Embedding(vocab, d * d)  # row j = flattened (row-major) d x d matrix of token j
        with torch.no_grad():
            nn.init.normal_(table.weight, mean=0.0, std=init_std)
            table.weight += torch.eye(d).flatten()
        return table

    # ------------------------------------------------------------------------------------------ encoding

    def _matrices(self, table: nn.Embedding, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, L, d, d) token matrices: dropout on the deviation from identity, identity at pad positions."""
        B, L = input_ids.shape
        d = self.cfg.d
        eye = torch.eye(d, dtype=table.weight.dtype, device=input_ids.device)
        X = table(input_ids).view(B, L, d, d)  # (B, L, d, d)
        if self.training and self.dropout.p > 0:
            # Dropout on X - I rather than on X: plain dropout zeroes diagonal entries of the near-identity
            # matrices, and over n tokens each diagonal direction of the product survives only with
            # probability (1-p)^n (p=0.1, n=64: 0.1%), so training-time products would collapse to ~0 while
            # eval-time products are ~I. A dropped entry here falls back to the identity's entry.
            X = eye + self.dropout(X - eye)
        if torch.compiler.is_exporting():  # the same values: ONNX Runtime runs the write below as NonZero +
            return torch.where(mask[:, :, None, None], X, eye)  # ScatterND, 3x this select; eager runs it faster
        X[~mask] = eye  # pads are identities (X is a fresh tensor: the lookup's backward does not need it)
        return X

    def _cmow(
        self, input_ids: torch.Tensor, mask: torch.Tensor, tokens: bool, scans: dict[str, torch.Tensor]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """CMOW parts of the sequence encoding and (with ``tokens``) of the token representations."""
        seq_parts: list[torch.Tensor] = []
        tok_parts: list[torch.Tensor] = []
        Xf = self._matrices(self.X_fw, input_ids, mask)  # (B, L, d, d)
        Xb = self._matrices(self.X_bw, input_ids, mask) if self.X_bw is not None else None
        if tokens:
            P = prefix_products(Xf)  # (B, L, d, d): P_i = X_1 ... X_i
            scans["P"] = P
            tok_parts.append(P.flatten(2))
            seq_parts.append(P[:, -1].flatten(1))  # X_1 ... X_n (pads are identities)
            if Xb is not None:
                S = suffix_products(Xb)  # (B, L, d, d): S_i = X_n ... X_i, aligned to position i
                scans["S"] = S
                tok_parts.append(S.flatten(2))
                seq_parts.append(S[:, 0].flatten(1))  # X_n ... X_1
        else:
            longest = self.task.max_seq_len  # (for an exported graph: see students/scan.py)
            seq_parts.append(tree_product(Xf, max_len=longest).flatten(1))
            if Xb is not None:
                seq_parts.append(tree_product(Xb, reverse=True, max_len=longest).flatten(1))  # X_n ... X_1
        return seq_parts, tok_parts

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, tokens: bool) -> Encoding:
        """Encode (B, L) ids; ``tokens`` also computes the per-token representations (prefix/suffix scans)
        instead of only the sequence products (one tree reduction per direction, about half the work)."""
        mask = attention_mask.bool()
        seq_parts: list[torch.Tensor] = []
        tok_parts: list[torch.Tensor] = []
        scans: dict[str, torch.Tensor] = {}
        if self.use_cmow:
            # Products of up to max_seq_len factors stay in fp32 under autocast (bf16 would round every level).
            with torch.autocast(device_type=input_ids.device.type, enabled=False):
                seq_cmow, tok_cmow = self._cmow(input_ids, mask, tokens, scans)
            seq_parts += seq_cmow
            tok_parts += tok_cmow
        if self.use_cbow:
            x = self.dropout(self.x_cbow(input_ids)) * mask[:, :, None]  # (B, L, d_vec), zero at pads
            # CBOW is the sum of the vectors (paper eq. h^(CBOW) = sum_j x_j; seq2mat's Seq2matCBOW sums too).
            total = x.sum(dim=1)  # (B, d_vec)
            if tokens:
                prefix = x.cumsum(dim=1)  # (B, L, d_vec): sum_{j<=i} x_j
                scans["x"], scans["prefix"], scans["total"] = x, prefix, total
                tok_parts.append(prefix)
                if self.n_dir == 2:
                    tok_parts.append(total[:, None] - prefix + x)  # sum_{j>=i} x_j
            # The whole-sequence CBOW sum is the same in both directions: included once (paper sec. III-A).
            seq_parts.append(total)
        seq = self.dropout(torch.cat(seq_parts, dim=-1))  # (B, D_seq)
        tok = None
        if tokens:
            tok = self.dropout(torch.cat(tok_parts, dim=-1))  # (B, L, D_tok)
            tok.masked_fill_(~mask[:, :, None], 0.0)  # in place: a fresh tensor, and a copy of it costs ~as much
        return Encoding(seq=seq, tokens=tok, scans=scans)

    def context_reps(self, enc: Encoding, positions: torch.Tensor) -> torch.Tensor:
        """Representations of the context around each position: (B, M) positions -> (B, M, D_tok).

        For a masked position i this is P_{i-1} || S_{i+1} || sum_{j<i} x_j || sum_{j>i} x_j, i.e. H_i with
        token i itself left out of every product and sum (P_0 = S_{n+1} = I, empty sums = 0). Why: the MLM
        target is token i, so its prediction should be a function of the context only. Including X_i, as
        H_i and the authors' code do, gives the same information for a [MASK] input (a fixed learned factor),
        but for BERT's 10% random / 10% unchanged inputs it multiplies a token-dependent matrix into the
        context state that a linear head cannot undo (noise, or a copy shortcut); left out, all three cases
        present one cloze problem. This mirrors bidirectional LMs such as ELMo (left state at i-1, right
        state at i+1). Slots of -1 read position 0 (arbitrary rows, as the batch contract allows).
        """
        if enc.tokens is None:
            raise ValueError("context_reps needs an encoding computed with tokens=True")
        B, M = positions.shape
        pos = positions.clamp(min=0)  # (B, M)
        rows = torch.arange(B, device=pos.device)[:, None]  # (B, 1)
        parts: list[torch.Tensor] = []
        if "P" in enc.scans:
            P = enc.scans["P"]
            eye = torch.eye(self.cfg.d, dtype=P.dtype, device=P.device).expand(B, 1, -1, -1)
            P_ext = torch.cat([eye, P], dim=1)  # (B, L+1, d, d): P_ext[i] = P_{i-1}
            parts.append(P_ext[rows, pos].flatten(2))
            if "S" in enc.scans:
                S_ext = torch.cat([enc.scans["S"], eye], dim=1)  # (B, L+1, d, d): S_ext[i+1] = S_{i+1}
                parts.append(S_ext[rows, pos + 1].flatten(2))
        if "prefix" in enc.scans:
            x, prefix, total = enc.scans["x"], enc.scans["prefix"], enc.scans["total"]
            at = prefix[rows, pos]  # (B, M, d_vec): sum_{j<=i}
            parts.append(at - x[rows, pos])  # sum_{j<i}
            if self.n_dir == 2:
                parts.append(total[:, None] - at)  # sum_{j>i}
        ctx = torch.cat(parts, dim=-1)  # (B, M, D_tok)
        assert ctx.shape == (B, M, self.token_features)
        return self.dropout(ctx)

    # ------------------------------------------------------------------------------------------ forward

    def forward(self, batch: dict[str, torch.Tensor], *, return_hidden: bool = False) -> StudentOutput:
        """``return_hidden``: also compute the per-token states of a joint classification input (for a
        hidden-state loss); inference skips them (the sequence encoding is a log-depth tree product)."""
        if self.task.kind == "mlm":
            enc = self.encode(batch["input_ids"], batch["attention_mask"], tokens=True)
            ctx = self.context_reps(enc, batch["mlm_positions"])  # (B, M, D_tok)
            return StudentOutput(mlm_logits=self.mlm_head(ctx), hidden=(enc.tokens,), hidden_stride=1)

        if self.task.encoding == "diffcat":
            # Paper sec. III-C: encode A and B separately; the head pools each and classifies [a, |a-b|, b].
            # No hidden states: the teacher's per-token states belong to the joint sequence, never encoded here.
            want = self.head.uses_tokens
            a = self.encode(batch["a_input_ids"], batch["a_attention_mask"], tokens=want)
            b = self.encode(batch["b_input_ids"], batch["b_attention_mask"], tokens=want)
            logits = self.head(
                a.seq,
                a.tokens,
                batch["a_attention_mask"].bool(),
                pair=(b.seq, b.tokens, batch["b_attention_mask"].bool()),
            )
            return StudentOutput(logits=logits)

        mask = batch["attention_mask"].bool()
        enc = self.encode(batch["input_ids"], mask, tokens=return_hidden or self.head.uses_tokens)
        logits = self.head(enc.seq, enc.tokens, mask)  # (B, C)
        return StudentOutput(logits=logits, hidden=(enc.tokens,) if return_hidden else (), hidden_stride=1)
