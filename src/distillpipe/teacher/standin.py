"""A stand-in teacher of any BERT shape whose forward costs ~nothing: for measuring everything but the forward.

A real BERT-Large forward at L 384 is ~0.3 TFLOP a row, hours on this project's 2-core CPUs for a sample
that tells anything about the rest of the path. :class:`StandInBert` has the structure the capture hooks
(:mod:`distillpipe.teacher.capture`) rely on: ``base_model.embeddings``, ``encoder.layer[i]`` with
``attention.self.query`` and ``key`` (``nn.Linear`` instances), a task or MLM head, a transformers-like
``config`` and a class name that names its head. Every module returns a slice of a fixed random tensor of
its output shape instead of computing (but the embedding layer, a real one with random tables: a lookup and a
LayerNorm): the hooks fire in the same order with the same shapes, and what comes after them is the real code: the
scores recomputed from the hooked projections, pooling, the compact forms, the MLM top-k, the host copy and checks,
the shard assembly, encoding, files, markers and manifest.

What it is not: a teacher. Its values are random normals (hidden states, projections, logits), so their
compression ratio differs from real activations' (``benchmarks/at_scale.py`` measures real MiniLM outputs
beside it) and a store built with it means nothing; it is never loaded by the pipeline's stages.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

SHAPES: dict[str, dict[str, int]] = {
    "bert-large": {"num_hidden_layers": 24, "hidden_size": 1024, "num_attention_heads": 16,
                   "intermediate_size": 4096, "vocab_size": 30522},
    "bert-base": {"num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12,
                  "intermediate_size": 3072, "vocab_size": 30522},
}
"""The teacher shapes of the seed papers (BERT-Large-WWM: WaLDORf; BERT-base: CMOW, MiniALBERT)."""
HEAD_CLASSES = {"base": "StandInBertModel", "mlm": "StandInBertForMaskedLM",
                "classification": "StandInBertForSequenceClassification", "qa": "StandInBertForQuestionAnswering"}


class _Bank(nn.Module):
    """A fixed random tensor (B_max, L_max, width); calling it returns the slice of the caller's batch shape."""

    def __init__(self, rows: int, length: int, width: int, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("values", torch.randn(rows, length, width, generator=g), persistent=False)

    def take(self, b: int, n: int) -> torch.Tensor:
        if b > self.values.shape[0] or n > self.values.shape[1]:
            raise ValueError(f"stand-in batch ({b}, {n}) exceeds its bank {tuple(self.values.shape[:2])}: build it "
                             "with a larger max_batch / max_seq_len")
        return self.values[:b, :n]


class FreeLinear(nn.Linear):
    """An ``nn.Linear`` (so the capture accepts it) that returns a bank slice of its output shape: (B, L, out)."""

    def __init__(self, in_features: int, out_features: int, bank: _Bank):
        nn.Module.__init__(self)  # no (out, in) weight: the stand-in's modules hold no parameters
        self.in_features, self.out_features, self.bank = in_features, out_features, bank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bank.take(x.shape[0], x.shape[1])
        assert out.shape[-1] == self.out_features, (out.shape, self.out_features)
        return out


class _Embeddings(nn.Module):
    """A real BERT embedding layer with random tables (``LayerNorm(word + position + token type)``, as BertEmbeddings
    in ``eval()``): its output is a function of the input ids, which a store derives from the tables instead of
    storing it (:class:`distillpipe.compact.DerivedEmbeddings`), so the capture's check of the derived values runs
    on the stand-in too. A lookup and a LayerNorm: next to nothing beside a BERT-Large forward."""

    def __init__(self, vocab: int, positions: int, d: int, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.word_embeddings = nn.Embedding(vocab, d)
        self.position_embeddings = nn.Embedding(positions, d)
        self.token_type_embeddings = nn.Embedding(2, d)
        self.LayerNorm = nn.LayerNorm(d, eps=1e-12)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        return self.LayerNorm(self.word_embeddings(input_ids) + self.position_embeddings(pos)
                              + self.token_type_embeddings(types))  # (B, L, d)


class _Layer(nn.Module):
    """One encoder layer: fires the query and key projections (the hooks), returns the next hidden states."""

    def __init__(self, d: int, heads: int, qk: _Bank, hidden: _Bank):
        super().__init__()
        self.attention = nn.Module()
        self.attention.self = nn.Module()
        self.attention.self.num_attention_heads, self.attention.self.attention_head_size = heads, d // heads
        self.attention.self.query = FreeLinear(d, d, qk)
        self.attention.self.key = FreeLinear(d, d, qk)
        self.hidden = hidden

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        self.attention.self.query(h)
        self.attention.self.key(h)
        return self.hidden.take(h.shape[0], h.shape[1])  # (B, L, d)


class _Encoder(nn.Module):
    def __init__(self, layers: list[_Layer]):
        super().__init__()
        self.layer = nn.ModuleList(layers)


class _Base(nn.Module):
    def __init__(self, embeddings: _Embeddings, encoder: _Encoder):
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))  # the device and dtype the capture reads off the parameters
        self.embeddings, self.encoder = embeddings, encoder
        self.config: SimpleNamespace | None = None

    @property
    def base_model(self) -> nn.Module:
        return self  # a headless teacher is its own base model, as in transformers

    def forward(self, input_ids, token_type_ids=None, attention_mask=None) -> SimpleNamespace:
        h = self.embeddings(input_ids, token_type_ids)
        for layer in self.encoder.layer:
            h = layer(h)
        return SimpleNamespace(last_hidden_state=h)


class StandInBert(nn.Module):
    """A BERT-shaped teacher that computes nothing; build it with :func:`standin_teacher`."""

    def __init__(self, config: SimpleNamespace, head: str, max_batch: int, max_seq_len: int, max_masked: int):
        super().__init__()
        d, b, n = config.hidden_size, max_batch, max_seq_len
        self.config = config
        self.head = head
        qk, hidden = _Bank(b, n, d, seed=1), _Bank(b, n, d, seed=2)
        layers = [_Layer(d, config.num_attention_heads, qk, hidden) for _ in range(config.num_hidden_layers)]
        self.bert = _Base(_Embeddings(config.vocab_size, n, d, seed=3), _Encoder(layers))
        if head == "mlm":
            self.cls = FreeLinear(d, config.vocab_size, _Bank(b, max(1, max_masked), config.vocab_size, seed=4))
        elif head in ("classification", "qa"):
            self.logits = _Bank(b, n, 2 if head == "qa" else config.num_labels, seed=5)

    @property
    def base_model(self) -> nn.Module:
        return self.bert

    def forward(self, input_ids, token_type_ids=None, attention_mask=None) -> SimpleNamespace:
        h = self.bert(input_ids, token_type_ids, attention_mask).last_hidden_state
        b, n = h.shape[:2]
        if self.head == "qa":
            span = self.logits.take(b, n)  # (B, L, 2)
            return SimpleNamespace(start_logits=span[..., 0], end_logits=span[..., 1])
        if self.head == "classification":
            return SimpleNamespace(logits=self.logits.take(b, 1)[:, 0])  # (B, C)
        return SimpleNamespace(last_hidden_state=h)


def standin_teacher(shape: str, head: str, *, max_batch: int, max_seq_len: int, max_masked: int = 0,
                    num_labels: int = 2) -> StandInBert:
    """A stand-in of ``shape`` (a key of :data:`SHAPES`) with ``head`` (base, mlm, classification, qa), in eval mode,
    for batches of at most ``max_batch`` rows of ``max_seq_len`` tokens (and ``max_masked`` MLM positions)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown stand-in shape {shape!r}; choose one of {sorted(SHAPES)}")
    if head not in HEAD_CLASSES:
        raise ValueError(f"unknown head {head!r}; choose one of {sorted(HEAD_CLASSES)}")
    config = SimpleNamespace(**SHAPES[shape], model_type="bert", num_labels=num_labels,  # BERT's modules (arch.py)
                             position_embedding_type="absolute", _attn_implementation="stand-in", name=shape)
    cls = type(HEAD_CLASSES[head], (StandInBert,), {})  # the capture reads the head off the class name
    model = cls(config, head, max_batch, max_seq_len, max_masked)
    if head == "base":
        model = model.bert
        model.config = config
    return model.eval()
