"""The bidirectional CMOW/CBOW-Hybrid student (CMOW paper, sec. III-A to III-C).

Each token j has a d x d matrix per direction (``X_fw``, and ``X_bw`` when bidirectional) and a d_vec
vector (``x_cbow``); all three are ``nn.Embedding`` tables. A sequence is encoded by ordered matrix
products (CMOW, order-aware) and vector sums (CBOW):

    token i (paper, eq. "Bidi. Hybrid", H_i):  flat(X_1..X_i) || flat(X_n..X_i) || sum_{j<=i} x_j || sum_{j>=i} x_j
    sequence (paper, full-sequence eq.):       flat(X_1..X_n) || flat(X_n..X_1) || sum_j x_j

(the backward parts only when bidirectional; the CMOW or CBOW parts only for the ``cmow`` / ``cbow``
variants). Products run as associative scans of depth O(log n) (below, "Associative scans").

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
import torch.nn.functional as F
from torch import nn

from distillpipe.config.students import CMOWHybridConfig
from distillpipe.students.base import StudentOutput, TaskSpec
from distillpipe.students.heads import build_head


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
        if torch.compiler.is_exporting() and not self.training:
            # The same values, spelled for ONNX Runtime: it runs the write below as NonZero + ScatterND, and a float
            # select over (B, L, d, d) took a fifth of the graph's time at batch 32; pads instead gather an identity
            # row appended to the table (a constant: ORT folds the Concat when it loads the graph).
            rows = torch.cat([table.weight, eye.reshape(1, d * d)])  # (V + 1, d * d)
            return F.embedding(torch.where(mask, input_ids, table.num_embeddings), rows).view(B, L, d, d)
        X = table(input_ids).view(B, L, d, d)  # (B, L, d, d)
        if self.training and self.dropout.p > 0:
            # Dropout on X - I rather than on X: plain dropout zeroes diagonal entries of the near-identity
            # matrices, and over n tokens each diagonal direction of the product survives only with
            # probability (1-p)^n (p=0.1, n=64: 0.1%), so training-time products would collapse to ~0 while
            # eval-time products are ~I. A dropped entry here falls back to the identity's entry.
            X = eye + self.dropout(X - eye)
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
            longest = self.task.max_seq_len  # (for an exported graph: see _static_tree_product)
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
            if torch.compiler.is_exporting() and not self.training:  # pads gather a zero row: no Mul over x
                rows = F.pad(self.x_cbow.weight, (0, 0, 0, 1))  # (V + 1, d_vec), a constant ORT folds
                x = F.embedding(torch.where(mask, input_ids, self.x_cbow.num_embeddings), rows)  # (B, L, d_vec)
            else:
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


# ----------------------------------------------------------------------------------------------------
# Associative scans of matrix products: the O(log n)-depth encoders behind CMOW. Kept in this module (not a
# students/ module of their own) because an architecture is one file: a stage that trains CMOW depends on this
# file, and no other architecture's stage does (docs/code-deps.md).
# ----------------------------------------------------------------------------------------------------
#
# CMOW encodes a sequence by the ordered product of its token matrices (CMOW paper, sec. III-A). Matrix
# multiplication is associative but not commutative, so the products can be evaluated as a balanced tree
# of ``log2 n`` levels instead of ``n`` sequential steps (paper, sec. V-E). Every level here is one or two batched
# ``matmul`` over all pairs of the level, so the python loop runs over the ``ceil(log2 n)`` levels only.
#
# - :func:`tree_product`: ``X_1 X_2 ... X_n`` (one reduction tree, n - 1 matmuls, depth ceil(log2 n)),
#   or ``X_n ... X_1`` with ``reverse=True``.
# - :func:`prefix_products`: inclusive scan ``P_i = X_1 ... X_i`` for every i, work-efficient odd/even
#   (Ladner-Fischer/Blelloch-style) recursion: about 2n matmuls, depth about 2 log2 n.
# - :func:`suffix_products`: ``S_i = X_n X_{n-1} ... X_i`` (the backward direction), the same recursion
#   with the later factor on the left.
#
# All functions take ``X`` of shape (B, L, d, d), keep the order of the factors, and run on any device and
# dtype. Padding is the caller's business: identity matrices at pad positions leave every product unchanged.
#
# Exporting (torch.export, ONNX): the tree's number of levels depends on L, which an exported graph with a dynamic
# sequence length cannot have, so while a model is being exported :func:`tree_product` is spelled with a fixed
# number of operations for every L up to the caller's ``max_len`` (:func:`_static_tree_product`), the same grouping
# of the factors and therefore bitwise the same product (tested).

EXPORT_CHUNK = 16
"""Positions per chunk of the exported spelling of :func:`tree_product`: an exported graph takes sequence lengths
that are multiples of it (pad with identities, i.e. masked positions, to get there)."""


def _identity_like(X: torch.Tensor, n: int) -> torch.Tensor:
    """``n`` identity matrices shaped like one position of ``X``: (B, n, d, d)."""
    B, _, d, _ = X.shape
    return torch.eye(d, dtype=X.dtype, device=X.device).expand(B, n, d, d)


def _check(X: torch.Tensor) -> None:
    if X.dim() != 4 or X.shape[-1] != X.shape[-2] or X.shape[1] < 1:
        raise ValueError(f"expected square matrices shaped (B, L >= 1, d, d), got {tuple(X.shape)}")


def _mm(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Batched product of (B, n, d, d) stacks. Through bmm on (B*n, d, d) views: the strided every-other-position
    slices of the scans fold into one batch dimension without the copy a 4-D matmul makes."""
    b, n, d, _ = A.shape
    return torch.bmm(A.reshape(b * n, d, d), B.reshape(b * n, d, d)).view(b, n, d, d)


def tree_product(X: torch.Tensor, *, reverse: bool = False, max_len: int | None = None) -> torch.Tensor:
    """Ordered product ``X[:, 0] @ X[:, 1] @ ... @ X[:, L-1]`` by pairwise tree reduction; with ``reverse``
    the backward product ``X[:, L-1] @ ... @ X[:, 0]`` (no reversal copy).

    X: (B, L, d, d) -> (B, d, d). Depth ceil(log2 L) batched matmuls. ``max_len``: the longest L the caller
    passes, needed only while the model is exported (see the module docstring).
    """
    _check(X)
    if torch.compiler.is_exporting():
        if max_len is None:
            raise ValueError("tree_product: exporting a model needs max_len (the longest sequence it will take)")
        return _static_tree_product(X, reverse, max_len)
    while X.shape[1] > 1:
        if X.shape[1] % 2:  # odd: an identity partner for the last factor keeps the order
            X = torch.cat([X, _identity_like(X, 1)], dim=1)
        even, odd = X[:, 0::2], X[:, 1::2]
        X = _mm(odd, even) if reverse else _mm(even, odd)  # (B, ceil(L/2), d, d): neighbours, in order
    return X[:, 0]


def _pad_identities(X: torch.Tensor, n) -> torch.Tensor:
    """(B, L, d, d) -> (B, L + n, d, d): ``n`` identities appended (zeros, plus ones on their diagonals: exact).
    ``n`` may be symbolic (exporting: a ``torch.SymInt``, not an int): then the padding is in the graph even where it
    comes to 0 rows. (A plain ``isinstance`` test: torch.fx's ``statically_known_true`` costs every process that
    builds a CMOW student 0.8 s of imports.)"""
    if isinstance(n, int) and n == 0:
        return X
    B, L, d, _ = X.shape
    is_pad = (torch.arange(L + n, device=X.device) >= L).to(X.dtype)  # (L + n,)
    return F.pad(X, (0, 0, 0, 0, 0, n)) + is_pad[:, None, None] * torch.eye(d, dtype=X.dtype, device=X.device)


def _halve(X: torch.Tensor, reverse: bool) -> torch.Tensor:
    """Neighbouring pairs along dim -3 multiplied, in order: (..., 2m, d, d) -> (..., m, d, d)."""
    even, odd = X.unflatten(-3, (-1, 2)).unbind(-3)  # (..., m, d, d) each (an ONNX Split, not two strided Slices)
    first, second = (odd, even) if reverse else (even, odd)
    d = X.shape[-1]
    return torch.bmm(first.reshape(-1, d, d), second.reshape(-1, d, d)).view(first.shape)


def _static_tree_product(X: torch.Tensor, reverse: bool, max_len: int) -> torch.Tensor:
    """:func:`tree_product` with a fixed number of operations for every L <= ``max_len``: the sequence is cut into
    chunks of :data:`EXPORT_CHUNK` (identities appended), each chunk reduced by a fixed tree, and the chunk products
    (identities appended up to a fixed power-of-two count) by another. Both trees group aligned power-of-two runs
    of factors, as :func:`tree_product` does, and a product with an identity is exact: the same bits. Traced with
    a symbolic L, L must be a multiple of the chunk (then no identities are appended to it)."""
    B, L, d, _ = X.shape
    c = EXPORT_CHUNK
    if isinstance(L, int):
        X = _pad_identities(X, -L % c)
    # else a symbolic L, which the export declares a multiple of c: appending 0 identities would still be a Pad and
    # an Add over all of X in the graph (a tenth of its time at batch 32)
    X = X.view(B, X.shape[1] // c, c, d, d)  # (B, K, c, d, d)
    for _ in range(c.bit_length() - 1):
        X = _halve(X, reverse)  # (B, K, c / 2^j, d, d)
    X = X[:, :, 0]  # (B, K, d, d): each chunk's product
    k_max = 1 << (-(-max_len // c) - 1).bit_length()  # chunks of the longest sequence, up to a power of two
    if X.shape[1] > k_max:
        raise ValueError(f"tree_product: {L} factors, but max_len is {max_len}")
    X = _pad_identities(X, k_max - X.shape[1])  # (B, k_max, d, d)
    while X.shape[1] > 1:  # k_max is a constant: a fixed number of levels
        X = _halve(X, reverse)
    return X[:, 0]


def _scan(X: torch.Tensor, reverse: bool) -> torch.Tensor:
    """Odd/even recursion. Forward: P_i = X_0 ... X_i. Reverse: S_i = X_{L-1} ... X_i (later factors left)."""
    L = X.shape[1]
    if L == 1:
        return X
    Xe = torch.cat([X, _identity_like(X, 1)], dim=1) if L % 2 else X  # (B, 2m, d, d); an identity changes nothing
    even, odd = Xe[:, 0::2], Xe[:, 1::2]  # (B, m, d, d) each
    # Multiply neighbours, scan the half-length sequence of pair products, fill in the other half.
    Q = _scan(_mm(odd, even) if reverse else _mm(even, odd), reverse)  # (B, m, d, d)
    out = torch.empty_like(Xe)
    if reverse:  # Q[j] = S_{2j};  S_{2j+1} = S_{2j+2} X_{2j+1};  S_{2m-1} = X_{2m-1}
        out[:, 0::2] = Q
        out[:, 1:-1:2] = _mm(Q[:, 1:], odd[:, :-1])
        out[:, -1] = Xe[:, -1]
    else:  # Q[j] = P_{2j+1};  P_{2j} = P_{2j-1} X_{2j};  P_0 = X_0
        out[:, 1::2] = Q
        out[:, 2::2] = _mm(Q[:, :-1], even[:, 1:])
        out[:, 0] = Xe[:, 0]
    return out[:, :L]


def prefix_products(X: torch.Tensor) -> torch.Tensor:
    """Inclusive scan ``P[:, i] = X[:, 0] @ X[:, 1] @ ... @ X[:, i]`` for every i.

    X: (B, L, d, d) -> (B, L, d, d). Odd/even recursion: multiply neighbouring pairs, scan the (half as long)
    sequence of pair products recursively, then fill in the even positions with one more matmul. Recursion
    depth ceil(log2 L); about 2L matmuls in all, each level two batched matmuls.
    """
    _check(X)
    return _scan(X, reverse=False)


def suffix_products(X: torch.Tensor) -> torch.Tensor:
    """Backward scan ``S[:, i] = X[:, L-1] @ X[:, L-2] @ ... @ X[:, i]`` for every i, aligned to position i.

    X: (B, L, d, d) -> (B, L, d, d). The same recursion with the later factor on the left (no reversal copies).
    """
    _check(X)
    return _scan(X, reverse=True)
