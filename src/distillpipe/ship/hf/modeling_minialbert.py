"""An exported distillpipe MiniALBERT student as a ``transformers`` model (``trust_remote_code``); needs torch and
transformers only. A re-implementation of the inference forward of ``distillpipe/students/minialbert.py``
(Nouriborji et al. 2022, sec. 3.2-3.4) with its parameter names, so ``model.safetensors`` loads as exported; tested
equal to distillpipe's module (tests/ship/test_ship_transformers.py).

  embeddings of width r (token + position + type, LayerNorm), projected to d when r != d      eq. (5)
  for i in 1..n_iterations (eq. 4): x = phi_att^i(x); x = LN(x + Attn(x)); x = phi_mlp^i(x); x = LN(x + FFN(x))
      with ONE shared layer and per-iteration adapters phi(X) = LN(W_up GELU(W_down X) + X) (eq. 3)
  the task head on the first ([CLS]) position of the last output

A DiffCat student (CMOW paper sec. III-C) reads each sentence of a pair tokenized on its own: ``a_input_ids``,
``a_attention_mask``, ``b_input_ids``, ``b_attention_mask``.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput

from .configuration_minialbert import MiniALBERTConfig
from .student_heads import build_head, pair_masks


class SelfAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.query, self.key, self.value = (nn.Linear(d_model, d_model) for _ in range(3))
        self.dense = nn.Linear(d_model, d_model)

    def forward(self, x, key_mask):
        B, L, d = x.shape
        H = self.n_heads
        q, k, v = (f(x).view(B, L, H, d // H).transpose(1, 2) for f in (self.query, self.key, self.value))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // H))  # (B, H, L, L)
        att = F.softmax(scores.masked_fill(~key_mask[:, None, None, :], torch.finfo(scores.dtype).min), dim=-1)
        return self.dense((att @ v).transpose(1, 2).reshape(B, L, d))


class SharedLayer(nn.Module):
    def __init__(self, m):
        super().__init__()
        d = m["d_model"]
        self.attention = SelfAttention(d, m["n_heads"])
        self.ln_att = nn.LayerNorm(d, eps=1e-12)
        self.ffn = nn.Linear(d, m["d_ff"])
        self.ffn_output = nn.Linear(m["d_ff"], d)
        self.ln_mlp = nn.LayerNorm(d, eps=1e-12)


class BottleneckAdapter(nn.Module):
    def __init__(self, d_model, size):
        super().__init__()
        self.down = nn.Linear(d_model, size)
        self.up = nn.Linear(size, d_model)
        self.ln = nn.LayerNorm(d_model, eps=1e-12)

    def forward(self, x):
        return self.ln(self.up(F.gelu(self.down(x))) + x)  # eq. (3), LayerNorm after the residual


class MiniALBERTForSequenceClassification(PreTrainedModel):
    config_class = MiniALBERTConfig
    base_model_prefix = "minialbert"

    def __init__(self, config):
        super().__init__(config)
        m, task = config.model, config.task
        r, d = m["embedding_size"], m["d_model"]
        self.tok_emb = nn.Embedding(task["vocab_size"], r)
        self.pos_emb = nn.Embedding(m["max_position_embeddings"], r)
        self.type_emb = nn.Embedding(2, r)
        self.ln_emb = nn.LayerNorm(r, eps=1e-12)
        self.emb_proj = nn.Linear(r, d) if r != d else None
        self.layer = SharedLayer(m)
        if m["adapter_size"]:
            self.adapters_att = nn.ModuleList(BottleneckAdapter(d, m["adapter_size"]) for _ in range(m["n_iterations"]))
            self.adapters_mlp = nn.ModuleList(BottleneckAdapter(d, m["adapter_size"]) for _ in range(m["n_iterations"]))
        self.head = build_head(task["head"], d, task["num_labels"], token_features=d, matrix_side=None,
                               pairs=task["encoding"] == "diffcat")
        self.post_init()

    def _init_weights(self, module):
        pass  # every weight comes from model.safetensors

    def encode(self, ids, mask, types=None):
        """The last iteration's output O_n: (B, L, d)."""
        m, layer = self.config.model, self.layer
        L = ids.shape[1]
        if L > (n := self.config.task["max_seq_len"]):
            raise ValueError(f"{L} tokens, over this student's max_seq_len {n}: tokenize with "
                             f"truncation=True, max_length={n} (as training cut rows)")
        types = torch.zeros_like(ids) if types is None else types
        pos = torch.arange(L, device=ids.device)
        x = self.ln_emb(self.tok_emb(ids) + self.pos_emb(pos)[None] + self.type_emb(types))  # (B, L, r)
        if self.emb_proj is not None:
            x = self.emb_proj(x)  # (B, L, d)
        for i in range(m["n_iterations"]):  # eq. (4)
            if m["adapter_size"]:
                x = self.adapters_att[i](x)
            x = layer.ln_att(x + layer.attention(x, mask))  # f_att
            if m["adapter_size"]:
                x = self.adapters_mlp[i](x)
            x = layer.ln_mlp(x + layer.ffn_output(F.gelu(layer.ffn(x))))  # f_mlp
        return x

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, a_input_ids=None,
                a_attention_mask=None, b_input_ids=None, b_attention_mask=None, **kwargs):
        if self.config.task["encoding"] == "diffcat":
            a_mask, b_mask = pair_masks(a_input_ids, a_attention_mask, b_input_ids, b_attention_mask)
            a, b = self.encode(a_input_ids, a_mask), self.encode(b_input_ids, b_mask)
            return SequenceClassifierOutput(logits=self.head(a[:, 0], a, a_mask, pair=(b[:, 0], b, b_mask)))
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        last = self.encode(input_ids, mask, token_type_ids)
        return SequenceClassifierOutput(logits=self.head(last[:, 0], last, mask))
