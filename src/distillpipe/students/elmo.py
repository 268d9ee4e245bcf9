"""ELMo-C and its two baselines (ELMo-C paper, sec. 3-4, Table 1): forward and backward LSTM language models
over a fixed word-vector input layer, differing only in the output layer.

    input       x_t = V[id_t]: the frozen word-vector table (buffer ``input_vectors``, FastText in the paper)
    encoder     per direction, n_layers x (LSTM with projection -> LayerNorm -> dropout), a residual connection
                from the second layer on (ELMo); the backward LM runs the same way over each row reversed
    output      shared by both directions (ELMo shares its softmax), under ``mlm_head`` (the loop's name for a
                pretraining output layer: a fine-tune copies everything but it and ``head``):
                continuous  Linear(d_proj, e), cosine distance to V[target] (eq. 2)          ELMo-C
                adaptive    nn.AdaptiveLogSoftmaxWithLoss(d_proj, V, cutoffs)               ELMo-A
                subword     Linear(d_proj, V), full softmax over the tokenizer's vocabulary   ELMo-Sub

Kind 'mlm' (language modelling on a corpus): the student reads ``batch['unmasked_input_ids']`` (the static MLM
masks undone: a causal LM must see the real tokens). Targets are the real tokens of each row (positions 1 to
length-2: [CLS]/[SEP] are context, never targets) whose table row is non-zero (special tokens have zero
vectors and are never targets); the forward LM predicts target t from its state at t-1, the backward LM from
its state at t+1. ``StudentOutput.lm`` holds the predictions; the ``lm`` loss term reads them.

Kind 'classification' (ELMo's feature-based use, Peters et al. 2018 eq. 1): the task head (attribute ``head``)
holds a learned scalar mix gamma * sum_j softmax(s)_j h_j of the n_layers biLM layers (h_j = [fw_j; bw_j],
2 d_proj wide), mean-pools it over the row's tokens and classifies with a head from
:mod:`distillpipe.students.heads` (DiffCat pairs: each sequence encoded and pooled separately). Finetune
runs with ``tune: head`` train only the mix and the classifier; the LM stays a frozen feature extractor.
The token layer (the fixed vectors) is not in the mix: it is e wide, not 2 d_proj, and nothing trained
would project it. QA is not supported.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from distillpipe.config.students import ElmoConfig
from distillpipe.students.base import LMOutput, StudentOutput, TaskSpec
from distillpipe.students.heads import build_head

TOP1_CHUNK = 1024  # predictions scored against the whole vocabulary at once (eval): 1024 x V floats


def reverse_rows(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse the first ``lengths[b]`` positions of each row of (B, T, ...) ``x``; padding stays in place.
    Its own inverse."""
    B, T = x.shape[:2]
    t = torch.arange(T, device=x.device)[None, :]  # (1, T)
    idx = torch.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)  # (B, T)
    return x.gather(1, idx.view(B, T, *([1] * (x.dim() - 2))).expand_as(x))


class ScalarMix(nn.Module):
    """ELMo's task-specific layer weighting (Peters et al. 2018, eq. 1): gamma * sum_j softmax(s)_j h_j."""

    def __init__(self, n_layers: int) -> None:
        super().__init__()
        self.scalars = nn.Parameter(torch.zeros(n_layers))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, layers: list[torch.Tensor]) -> torch.Tensor:
        w = torch.softmax(self.scalars, dim=0)  # (n_layers,)
        return self.gamma * sum(w[j] * h for j, h in enumerate(layers))


class ElmoHead(nn.Module):
    """Scalar mix of the biLM layers -> masked mean over tokens -> a classification head (DiffCat for pairs)."""

    def __init__(self, cfg: ElmoConfig, task: TaskSpec) -> None:
        super().__init__()
        assert task.head is not None
        width = 2 * cfg.d_proj
        self.mix = ScalarMix(cfg.n_layers)
        self.classify = build_head(task.head, width, task.num_labels, token_features=width, matrix_side=None,
                                   pairs=task.encoding == "diffcat")

    def features(self, layers: list[torch.Tensor], mask: torch.Tensor):
        tokens = self.mix(layers) * mask[:, :, None]  # (B, T, 2 d_proj), zero at pads
        seq = tokens.sum(1) / mask.sum(1, keepdim=True).clamp(min=1)  # (B, 2 d_proj)
        return seq, tokens, mask

    def forward(self, layers: list[torch.Tensor], mask: torch.Tensor,
                pair: tuple[list[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        b = self.features(*pair) if pair is not None else None
        return self.classify(*self.features(layers, mask), pair=b)


class _Direction(nn.Module):
    """One direction's LSTM stack: LSTM with projection -> LayerNorm (ELMo-C sec. 4.1) -> dropout, residual
    from the second layer on."""

    def __init__(self, cfg: ElmoConfig) -> None:
        super().__init__()
        self.lstms = nn.ModuleList(
            nn.LSTM(cfg.d_input if j == 0 else cfg.d_proj, cfg.d_hidden, proj_size=cfg.d_proj, batch_first=True)
            for j in range(cfg.n_layers))
        self.norms = nn.ModuleList(nn.LayerNorm(cfg.d_proj) for _ in range(cfg.n_layers))
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """(B, T, e) -> n_layers x (B, T, d_proj). Causal: position t reads positions <= t only."""
        out, h = [], x
        for j, (lstm, norm) in enumerate(zip(self.lstms, self.norms)):
            y = self.dropout(norm(lstm(h)[0]))
            h = y + h if j > 0 else y
            out.append(h)
        return out


class Elmo(nn.Module):
    """ELMo-C / ELMo-A / ELMo-Sub (``cfg.output``); see the module docstring."""

    def __init__(self, cfg: ElmoConfig, task: TaskSpec) -> None:
        super().__init__()
        if task.kind == "qa":
            raise ValueError("the elmo student has no QA (span) head: train it on 'mlm' (language modelling) or "
                             "'classification' tasks")
        self.cfg, self.task = cfg, task
        V = task.vocab_size
        self.register_buffer("input_vectors", torch.zeros(V, cfg.d_input))  # frozen; copied in by the loop
        self.dropout = nn.Dropout(cfg.dropout)
        self.fw = _Direction(cfg)
        self.bw = _Direction(cfg)
        if task.kind == "mlm":
            if cfg.output == "continuous":
                self.mlm_head = nn.Linear(cfg.d_proj, cfg.d_input)  # footnote 2: project to the embedding size
            elif cfg.output == "subword":
                self.mlm_head = nn.Linear(cfg.d_proj, V)
            else:
                if cfg.adaptive_cutoffs[-1] >= V:
                    raise ValueError(f"elmo: adaptive_cutoffs {cfg.adaptive_cutoffs} must be < the vocabulary "
                                     f"size {V}")
                self.mlm_head = nn.AdaptiveLogSoftmaxWithLoss(cfg.d_proj, V, cfg.adaptive_cutoffs,
                                                            div_value=cfg.adaptive_div_value)
            if isinstance(self.mlm_head, nn.Linear):  # the adaptive softmax keeps torch's init (see ElmoConfig)
                nn.init.normal_(self.mlm_head.weight, std=cfg.init_std)
                nn.init.zeros_(self.mlm_head.bias)
        else:
            self.head = ElmoHead(cfg, task)

    def layers(self, input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Forward and backward LM states: two lists of n_layers x (B, T, d_proj), position-aligned (the
        backward state at t has read tokens >= t of its row), zero at padding."""
        lengths = mask.sum(1)  # (B,)
        x = self.dropout(F.embedding(input_ids, self.input_vectors))  # (B, T, e)
        fw = self.fw(x)
        bw = [reverse_rows(h, lengths) for h in self.bw(reverse_rows(x, lengths))]
        m = mask[:, :, None]
        return [h * m for h in fw], [h * m for h in bw]

    def biLM(self, input_ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
        """n_layers x (B, T, 2 d_proj): [fw_j; bw_j] per layer."""
        fw, bw = self.layers(input_ids, mask)
        return [torch.cat([f, b], dim=-1) for f, b in zip(fw, bw)]

    def forward(self, batch: dict[str, torch.Tensor], *, return_hidden: bool = False) -> StudentOutput:
        if self.task.kind == "mlm":
            ids, mask = batch["unmasked_input_ids"], batch["attention_mask"].bool()
            fw, bw = self.layers(ids, mask)
            hidden = tuple(torch.cat([f, b], dim=-1) for f, b in zip(fw, bw)) if return_hidden else ()
            return StudentOutput(lm=self._lm(ids, mask, fw[-1], bw[-1]), hidden=hidden, hidden_stride=1)
        if self.task.encoding == "diffcat":
            a_mask, b_mask = batch["a_attention_mask"].bool(), batch["b_attention_mask"].bool()
            logits = self.head(self.biLM(batch["a_input_ids"], a_mask), a_mask,
                               pair=(self.biLM(batch["b_input_ids"], b_mask), b_mask))
            return StudentOutput(logits=logits)
        mask = batch["attention_mask"].bool()
        layers = self.biLM(batch["input_ids"], mask)
        return StudentOutput(logits=self.head(layers, mask), hidden=tuple(layers) if return_hidden else (),
                             hidden_stride=1)

    def targets(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, T) bool: the positions that are prediction targets (see the module docstring)."""
        T = ids.shape[1]
        pos = torch.arange(T, device=ids.device)[None, :]
        last = mask.sum(1, keepdim=True) - 1  # (B, 1) the [SEP]
        has_vector = self.input_vectors.ne(0).any(dim=1)  # (V,) special tokens have zero vectors
        return mask & (pos >= 1) & (pos < last) & has_vector[ids]

    def _lm(self, ids: torch.Tensor, mask: torch.Tensor, fw: torch.Tensor, bw: torch.Tensor) -> LMOutput:
        tgt = self.targets(ids, mask)  # (B, T)
        # forward LM: target t from the state at t-1; backward LM: target t from the state at t+1
        states = torch.cat([fw[:, :-1][tgt[:, 1:]], bw[:, 1:][tgt[:, :-1]]])  # (N, d_proj), N = 2 x targets
        target_ids = torch.cat([ids[:, 1:][tgt[:, 1:]], ids[:, :-1][tgt[:, :-1]]])  # (N,)
        out = LMOutput(target_ids=target_ids)
        if self.cfg.output == "continuous":
            out.vectors = self.mlm_head(states)  # (N, e)
            out.target_vectors = self.input_vectors[target_ids]  # (N, e), fixed
        elif self.cfg.output == "subword":
            # log p(target) = z_target - logsumexp(z): one (N, V) product, read twice, no (N, V) log-softmax written
            logits = self.mlm_head(states).float()  # (N, V)
            out.logprob = logits.gather(1, target_ids[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)
            if not self.training:
                out.top1 = logits.detach().argmax(-1)  # the same product, not a second one
                return out
        else:
            out.logprob = self.mlm_head(states, target_ids).output  # (N,)
        if not self.training:
            out.top1 = self._top1(states, out.vectors)
        return out

    @torch.no_grad()
    def _top1(self, states: torch.Tensor, vectors: torch.Tensor | None) -> torch.Tensor:
        """(N,) the most likely token under the adaptive softmax, or the target-able token nearest by cosine."""
        if vectors is not None:
            table = F.normalize(self.input_vectors, dim=-1)  # (V, e); zero rows stay zero
            banned = self.input_vectors.eq(0).all(dim=1).nonzero()[:, 0]  # the special tokens (no vector)
        parts = []
        for i in range(0, states.shape[0], TOP1_CHUNK):
            s = states[i:i + TOP1_CHUNK]
            if vectors is not None:
                scores = F.normalize(vectors[i:i + TOP1_CHUNK].float(), dim=-1) @ table.T  # (n, V)
                # in place, on the few banned columns: a masked copy of the (n, V) scores cost more than the product
                parts.append(scores.index_fill_(1, banned, -2.0).argmax(-1))
            else:
                parts.append(self.mlm_head.predict(s))
        return torch.cat(parts) if parts else states.new_zeros(0, dtype=torch.long)
