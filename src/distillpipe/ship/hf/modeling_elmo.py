"""An exported distillpipe ELMo classification student (ELMo-C, ELMo-A or ELMo-Sub features under a task head) as a
``transformers`` model (``trust_remote_code``); needs torch and transformers only. A re-implementation of the
inference forward of ``distillpipe/students/elmo.py`` with its parameter names, so ``model.safetensors`` loads as
exported; tested equal to distillpipe's module (tests/ship/test_ship_transformers.py).

    x_t = V[id_t]                the fixed word-vector table (buffer ``input_vectors``; ELMo-C sec. 4.1)
    per direction, n_layers x   LSTM with projection -> LayerNorm (ELMo-C sec. 4.1), residual from layer 2 on;
                                 the backward LM reads each row reversed (its padding stays at the end)
    h_j = [fw_j; bw_j]           layer j of the biLM, 2 d_proj wide, zero at padding
    the task head                scalar mix gamma * sum_j softmax(s)_j h_j (Peters et al. 2018 eq. 1), mean over
                                 the row's tokens, then a head of student_heads.py

The three variants differ only in the language model's output layer (ELMo-C paper Table 1), which a fine-tuned
classification student does not have: one model class serves all three. Dropout is left out (inference only). A
DiffCat student (CMOW paper sec. III-C) reads each sentence of a pair tokenized on its own: ``a_input_ids``,
``a_attention_mask``, ``b_input_ids``, ``b_attention_mask``.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput

from .configuration_elmo import ElmoConfig
from .student_heads import build_head, pair_masks


def reverse_rows(x, lengths):
    """Reverse the first ``lengths[b]`` positions of each row of (B, T, ...) ``x``; padding stays in place."""
    B, T = x.shape[:2]
    t = torch.arange(T, device=x.device)[None, :]  # (1, T)
    idx = torch.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)  # (B, T)
    return x.gather(1, idx.view(B, T, *([1] * (x.dim() - 2))).expand_as(x))


class ScalarMix(nn.Module):
    """ELMo's task-specific weighting of the biLM layers. The ELMo-C paper uses ELMo's features as Peters et al.
    (2018) define them (sec. 2, after eq. 1: "we refer the reader to Peters et al."; sec. 4.1, downstream
    benchmarks: the feature-based approach): Peters et al. eq. (1), ELMo_k = gamma * sum_j s_j h_{k,j} with
    s = softmax(w). The token layer (j = 0) is not mixed here: it is the e-wide word vector, not 2 d_proj."""

    def __init__(self, n_layers):
        super().__init__()
        self.scalars = nn.Parameter(torch.zeros(n_layers))  # w, softmax-normalised to s
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, layers):
        s = torch.softmax(self.scalars, dim=0)  # (n_layers,)
        return self.gamma * sum(s[j] * h for j, h in enumerate(layers))  # Peters et al. eq. (1)


class ElmoHead(nn.Module):
    """Scalar mix -> masked mean over tokens -> a head of student_heads.py (``classify``); the bilstm head reads
    the mixed tokens instead of the mean."""

    def __init__(self, task, width, n_layers):
        super().__init__()
        self.mix = ScalarMix(n_layers)
        self.classify = build_head(task["head"], width, task["num_labels"], token_features=width, matrix_side=None,
                                   pairs=task["encoding"] == "diffcat")

    def features(self, layers, mask):
        tokens = self.mix(layers) * mask[:, :, None]  # (B, T, 2 d_proj), zero at pads
        seq = tokens.sum(1) / mask.sum(1, keepdim=True).clamp(min=1)  # (B, 2 d_proj)
        return seq, tokens, mask

    def forward(self, layers, mask, pair=None):
        b = self.features(*pair) if pair is not None else None
        return self.classify(*self.features(layers, mask), pair=b)


class Direction(nn.Module):
    """One direction's LSTM stack: LSTM with projection -> LayerNorm (ELMo-C sec. 4.1), residual from the second
    layer on."""

    def __init__(self, m):
        super().__init__()
        self.lstms = nn.ModuleList(
            nn.LSTM(m["d_input"] if j == 0 else m["d_proj"], m["d_hidden"], proj_size=m["d_proj"], batch_first=True)
            for j in range(m["n_layers"]))
        self.norms = nn.ModuleList(nn.LayerNorm(m["d_proj"]) for _ in range(m["n_layers"]))

    def forward(self, x):
        """(B, T, e) -> n_layers x (B, T, d_proj). Causal: position t reads positions <= t only."""
        out, h = [], x
        for j, (lstm, norm) in enumerate(zip(self.lstms, self.norms)):
            y = norm(lstm(h)[0])
            h = y + h if j > 0 else y
            out.append(h)
        return out


class ElmoForSequenceClassification(PreTrainedModel):
    config_class = ElmoConfig
    base_model_prefix = "elmo"

    def __init__(self, config):
        super().__init__(config)
        m, task = config.model, config.task
        self.register_buffer("input_vectors", torch.zeros(task["vocab_size"], m["d_input"]))  # from the export
        self.fw = Direction(m)
        self.bw = Direction(m)
        self.head = ElmoHead(task, 2 * m["d_proj"], m["n_layers"])
        self.post_init()

    def _init_weights(self, module):
        pass  # every weight (and the word-vector table) comes from model.safetensors

    def biLM(self, ids, mask):
        """n_layers x (B, T, 2 d_proj): [fw_j; bw_j] per layer, position-aligned (the backward state at t has read
        tokens >= t of its row), zero at padding. Rows are right-padded (the tokenizer's default)."""
        if ids.shape[1] > (n := self.config.task["max_seq_len"]):
            raise ValueError(f"{ids.shape[1]} tokens, over this student's max_seq_len {n}: tokenize with "
                             f"truncation=True, max_length={n} (as training cut rows)")
        lengths = mask.sum(1)  # (B,)
        x = F.embedding(ids, self.input_vectors)  # (B, T, e)
        fw = self.fw(x)
        bw = [reverse_rows(h, lengths) for h in self.bw(reverse_rows(x, lengths))]
        m = mask[:, :, None]
        return [torch.cat([f * m, b * m], dim=-1) for f, b in zip(fw, bw)]

    def forward(self, input_ids=None, attention_mask=None, a_input_ids=None, a_attention_mask=None,
                b_input_ids=None, b_attention_mask=None, **kwargs):
        if self.config.task["encoding"] == "diffcat":
            a_mask, b_mask = pair_masks(a_input_ids, a_attention_mask, b_input_ids, b_attention_mask)
            logits = self.head(self.biLM(a_input_ids, a_mask), a_mask, pair=(self.biLM(b_input_ids, b_mask), b_mask))
            return SequenceClassifierOutput(logits=logits)
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        return SequenceClassifierOutput(logits=self.head(self.biLM(input_ids, mask), mask))
