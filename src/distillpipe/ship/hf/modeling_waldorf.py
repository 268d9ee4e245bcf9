"""An exported distillpipe WaLDORf student as a ``transformers`` model (``trust_remote_code``); needs torch and
transformers only. A re-implementation of the inference forward of ``distillpipe/students/waldorf.py`` (Tian et al.
2019, "WaLDORf", sec. 3.2, Fig. 1) with its parameter names, so ``model.safetensors`` loads as exported; tested equal
to distillpipe's module (tests/ship/test_ship_transformers.py).

  embeddings (eq. 1: token + position + type, LayerNorm)                       (B, L, e)
  2 x [conv, GELU, max-pool 2 over real positions]                             (B, Lp/4, c2), Lp = 4 ceil(L/4)
  time-distributed expansion to d_model, n_layers BERT post-LN blocks          (B, Lp/4, d)
  QA: 2 x [up-sample 2, conv, GELU, conv, skip from the up-sampled input, LN]  (B, Lp, d) -> start/end logits
  classification: masked mean of the last block -> the task head
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import QuestionAnsweringModelOutput, SequenceClassifierOutput

from .configuration_waldorf import WaLDORfConfig
from .student_heads import build_head


def _pool_mask(mask):
    B, L = mask.shape
    return mask.view(B, L // 2, 2).any(dim=2)  # a pooled position is real if either of its two is


class SelfAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x, key_mask):
        B, n, d = x.shape
        H = self.n_heads
        q, k, v = (t.view(B, n, H, d // H).transpose(1, 2) for t in self.qkv(x).split(d, dim=2))  # (B, H, n, dh)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // H))  # (B, H, n, n)
        att = F.softmax(scores.masked_fill(~key_mask[:, None, None, :], torch.finfo(scores.dtype).min), dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, n, d))


class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.attn = SelfAttention(m["d_model"], m["n_heads"])
        self.ln_1 = nn.LayerNorm(m["d_model"])
        self.ffn = nn.Sequential(nn.Linear(m["d_model"], m["d_ff"]), nn.GELU(), nn.Linear(m["d_ff"], m["d_model"]))
        self.ln_2 = nn.LayerNorm(m["d_model"])

    def forward(self, x, mask):
        x = self.ln_1(x + self.attn(x, mask))
        return self.ln_2(x + self.ffn(x))


class DownStage(nn.Module):
    def __init__(self, c_in, c_out, kernel):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, padding=kernel // 2)

    def forward(self, x, mask):
        x = F.gelu(self.conv(x.masked_fill(~mask[:, None, :], 0.0)))  # (B, C_out, L)
        x = F.max_pool1d(x.masked_fill(~mask[:, None, :], float("-inf")), 2)  # (B, C_out, L/2)
        pooled = _pool_mask(mask)
        return x.masked_fill(~pooled[:, None, :], 0.0), pooled


class UpStage(nn.Module):
    def __init__(self, d, kernel):
        super().__init__()
        self.conv_a = nn.Conv1d(d, d, kernel, padding=kernel // 2)
        self.conv_b = nn.Conv1d(d, d, kernel, padding=kernel // 2)
        self.ln = nn.LayerNorm(d)

    def forward(self, x, mask):
        invalid = ~mask[:, None, :]
        u = x.repeat_interleave(2, dim=2).masked_fill(invalid, 0.0)  # (B, d, 2n)
        c = self.conv_b(F.gelu(self.conv_a(u)).masked_fill(invalid, 0.0))
        return self.ln((u + c).transpose(1, 2)).transpose(1, 2)  # skip, then LayerNorm (Fig. 1)


class WaLDORfPreTrainedModel(PreTrainedModel):
    config_class = WaLDORfConfig
    base_model_prefix = "waldorf"

    def _init_weights(self, module):
        pass  # every weight comes from model.safetensors

    def _build(self, qa):
        m, task = self.config.model, self.config.task
        e, d, (c1, c2), k = m["embedding_size"], m["d_model"], m["conv_channels"], m["conv_kernel"]
        self.tok_emb = nn.Embedding(task["vocab_size"], e)
        self.pos_emb = nn.Embedding(task["max_seq_len"], e)
        self.type_emb = nn.Embedding(2, e)
        self.ln_emb = nn.LayerNorm(e)
        self.down_1 = DownStage(e, c1, k)
        self.down_2 = DownStage(c1, c2, k)
        self.expand = nn.Linear(c2, d)
        self.blocks = nn.ModuleList(Block(m) for _ in range(m["n_layers"]))
        if qa:
            self.up_1, self.up_2 = UpStage(d, k), UpStage(d, k)
            self.head = nn.Linear(d, 2)

    def encode(self, input_ids, attention_mask=None, token_type_ids=None):
        """(last block's output (B, Lp/4, d), masks at Lp, Lp/2, Lp/4)."""
        L = input_ids.shape[1]
        if L > (n := self.config.task["max_seq_len"]):
            raise ValueError(f"{L} tokens, over this student's max_seq_len {n}: tokenize with "
                             f"truncation=True, max_length={n} (as training cut rows)")
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        pos = torch.arange(L, device=input_ids.device)
        emb = self.ln_emb(self.tok_emb(input_ids) + self.pos_emb(pos)[None] + self.type_emb(types))  # (B, L, e)
        Lp = 4 * ((L + 3) // 4)
        x = F.pad(emb, (0, 0, 0, Lp - L)).transpose(1, 2)  # (B, e, Lp)
        mask_1 = F.pad(mask, (0, Lp - L), value=False)
        x, mask_2 = self.down_1(x, mask_1)
        x, mask_4 = self.down_2(x, mask_2)
        x = self.expand(x.transpose(1, 2))  # (B, Lp/4, d)
        for block in self.blocks:
            x = block(x, mask_4)
        return x, (mask_1, mask_2, mask_4)


class WaLDORfForQuestionAnswering(WaLDORfPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        if config.task["kind"] != "qa":
            raise ValueError("this WaLDORf student classifies: load it with AutoModelForSequenceClassification")
        self._build(qa=True)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, **kwargs):
        L = input_ids.shape[1]
        x, (mask_1, mask_2, _) = self.encode(input_ids, attention_mask, token_type_ids)
        x = self.up_2(self.up_1(x.transpose(1, 2), mask_2), mask_1)  # (B, d, Lp)
        start, end = self.head(x.transpose(1, 2)[:, :L]).unbind(dim=-1)  # (B, L) each
        return QuestionAnsweringModelOutput(start_logits=start, end_logits=end)


class WaLDORfForSequenceClassification(WaLDORfPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        if config.task["kind"] != "classification":
            raise ValueError("this WaLDORf student answers questions: load it with AutoModelForQuestionAnswering")
        self._build(qa=False)
        d = config.model["d_model"]
        self.head = build_head(config.task["head"], d, config.task["num_labels"], token_features=d, matrix_side=None,
                               pairs=False)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, **kwargs):
        x, (_, _, mask_4) = self.encode(input_ids, attention_mask, token_type_ids)
        m = mask_4[..., None].to(x.dtype)  # (B, Lp/4, 1)
        pooled = (x * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)  # mean over real positions
        return SequenceClassifierOutput(logits=self.head(pooled, x, mask_4))
