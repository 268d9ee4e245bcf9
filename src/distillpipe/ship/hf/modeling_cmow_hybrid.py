"""An exported distillpipe CMOW/CBOW-Hybrid student as a ``transformers`` model (``trust_remote_code``); needs torch
and transformers only. A re-implementation of the inference forward of ``distillpipe/students/cmow_hybrid.py`` (CMOW
paper, sec. III-A to III-C) with its parameter names, so ``model.safetensors`` loads as exported; tested equal to
distillpipe's module (tests/ship/test_ship_transformers.py).

    sequence (paper, full-sequence eq.):  flat(X_1..X_n) || flat(X_n..X_1) || sum_j x_j
    token i (paper, "Bidi. Hybrid" H_i):  flat(X_1..X_i) || flat(X_n..X_i) || sum_{j<=i} x_j || sum_{j>=i} x_j

(backward parts when bidirectional; CMOW or CBOW parts per variant). Pad positions are identity matrices and zero
vectors. Token representations are computed only for the bilstm head. A DiffCat student (sec. III-C) reads each
sentence of a pair tokenized on its own: ``a_input_ids``, ``a_attention_mask``, ``b_input_ids``, ``b_attention_mask``.
"""

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput

from .configuration_cmow_hybrid import CMOWHybridConfig
from .student_heads import build_head, pair_masks


def tree_product(X, reverse=False):
    """X_1 X_2 ... X_L (``reverse``: X_L ... X_1) by pairwise reduction, as distillpipe groups it:
    (B, L, d, d) -> (B, d, d)."""
    while X.shape[1] > 1:
        if X.shape[1] % 2:  # an identity partner for the last factor keeps the order
            X = torch.cat([X, torch.eye(X.shape[-1], dtype=X.dtype, device=X.device).expand(X.shape[0], 1, -1, -1)],
                          dim=1)
        even, odd = X[:, 0::2], X[:, 1::2]
        X = odd @ even if reverse else even @ odd  # (B, ceil(L/2), d, d)
    return X[:, 0]


def running_products(X, reverse=False):
    """P_i = X_1 ... X_i (``reverse``: S_i = X_L ... X_i) for every i, one step at a time: (B, L, d, d)."""
    order = range(X.shape[1] - 1, -1, -1) if reverse else range(X.shape[1])
    out, acc = [None] * X.shape[1], None
    for i in order:
        acc = X[:, i] if acc is None else acc @ X[:, i]
        out[i] = acc
    return torch.stack(out, dim=1)


class CMOWHybridForSequenceClassification(PreTrainedModel):
    config_class = CMOWHybridConfig
    base_model_prefix = "cmow_hybrid"

    def __init__(self, config):
        super().__init__(config)
        m, task = config.model, config.task
        d, V = m["d"], task["vocab_size"]
        self.use_cmow = m["variant"] in ("cmow", "hybrid")
        self.use_cbow = m["variant"] in ("cbow", "hybrid")
        self.n_dir = 2 if m["bidirectional"] else 1
        self.X_bw = None
        if self.use_cmow:
            self.X_fw = nn.Embedding(V, d * d)  # row j: token j's d x d matrix, row-major
            if m["bidirectional"]:
                self.X_bw = nn.Embedding(V, d * d)
        if self.use_cbow:
            self.x_cbow = nn.Embedding(V, m["d_vec"])
        seq_features = self.n_dir * d * d * self.use_cmow + m["d_vec"] * self.use_cbow
        token_features = self.n_dir * (d * d * self.use_cmow + m["d_vec"] * self.use_cbow)
        self.head = build_head(task["head"], seq_features, task["num_labels"], token_features=token_features,
                               matrix_side=d if self.use_cmow else None, pairs=task["encoding"] == "diffcat")
        self.post_init()

    def _init_weights(self, module):
        pass  # every weight comes from model.safetensors

    def _matrices(self, table, ids, mask):
        B, L = ids.shape
        d = self.config.model["d"]
        X = table(ids).view(B, L, d, d)
        return torch.where(mask[:, :, None, None], X, torch.eye(d, dtype=X.dtype, device=X.device))  # pads: I

    def encode(self, ids, mask):
        """(sequence encoding (B, D_seq), token representations (B, L, D_tok) for the bilstm head, else None)."""
        if ids.shape[1] > (n := self.config.task["max_seq_len"]):
            raise ValueError(f"{ids.shape[1]} tokens, over this student's max_seq_len {n}: tokenize with "
                             f"truncation=True, max_length={n} (as training cut rows)")
        tokens = self.head.uses_tokens
        seq, tok = [], []
        if self.use_cmow:
            for table, reverse in ((self.X_fw, False), (self.X_bw, True)):
                if table is None:
                    continue
                X = self._matrices(table, ids, mask)  # (B, L, d, d)
                seq.append(tree_product(X, reverse).flatten(1))
                if tokens:
                    tok.append(running_products(X, reverse).flatten(2))
        if self.use_cbow:
            x = self.x_cbow(ids) * mask[:, :, None]  # (B, L, d_vec), zero at pads
            total = x.sum(dim=1)  # CBOW: the sum of the vectors, once for both directions
            seq.append(total)
            if tokens:
                prefix = x.cumsum(dim=1)
                tok += [prefix, total[:, None] - prefix + x] if self.n_dir == 2 else [prefix]
        reps = torch.cat(tok, dim=-1).masked_fill(~mask[:, :, None], 0.0) if tokens else None
        return torch.cat(seq, dim=-1), reps

    def forward(self, input_ids=None, attention_mask=None, a_input_ids=None, a_attention_mask=None,
                b_input_ids=None, b_attention_mask=None, **kwargs):
        if self.config.task["encoding"] == "diffcat":
            a_mask, b_mask = pair_masks(a_input_ids, a_attention_mask, b_input_ids, b_attention_mask)
            a, b = self.encode(a_input_ids, a_mask), self.encode(b_input_ids, b_mask)
            return SequenceClassifierOutput(logits=self.head(a[0], a[1], a_mask, pair=(b[0], b[1], b_mask)))
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        seq, reps = self.encode(input_ids, mask)
        return SequenceClassifierOutput(logits=self.head(seq, reps, mask))
