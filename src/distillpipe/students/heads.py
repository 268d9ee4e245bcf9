"""Classification heads for sequence encoders (CMOW paper, sec. III-A and supplement A).

Every head has one calling convention, so a student never branches on the head type:

    head(seq_enc, token_reps, mask, pair=None) -> logits (B, C)

- ``seq_enc`` (B, F): the pooled sequence encoding (CMOW: flattened matrix products, CBOW: sums).
- ``token_reps`` (B, L, D_tok) and ``mask`` (B, L) bool: per-token representations and real tokens; only
  heads with ``uses_tokens = True`` read them (a student may pass ``None`` to the others).
- ``pair``: for DiffCat two-sequence encoding, the same triple for sequence B. Each sequence is pooled
  separately to ``u`` and the head classifies ``[u_a, |u_a - u_b|, u_b]`` (paper sec. III-C, DiffCat).

A head is ``pool`` (one sequence -> (B, P) features) followed by ``classifier`` (features -> logits), an
``nn.Module`` attribute so its input can be observed. The heads:

- ``linear``: a linear probe on ``seq_enc``.
- ``mlp``: Linear -> ReLU -> Dropout -> LayerNorm -> Linear on ``seq_enc``. The LayerNorm is the paper's:
  its Table XIII counts 3,605,002 classifier parameters for 3,600 inputs, 1,000 hidden units and 2 classes
  = 3600*1000+1000 (Linear) + 2*1000 (LayerNorm) + 1000*2+2 (Linear).
- ``cnn``: the 2D CNN of supplement A on the aggregated matrices. ``seq_enc`` is laid out row-major into
  d x d channels, in order: one per CMOW direction (its product matrix exactly) and, for the hybrid, the
  CBOW sum as ceil(d_vec / d^2) further channel(s), zero-filled at the end (the paper uses d_vec = 400 =
  20 x 20, one channel: "two [filters] for hybrid variants"). With DiffCat the channels of a, |a-b| and b
  follow in that order (3x the channels). This reproduces the paper's counts exactly (Table
  XIII: 11,764 classifier parameters for the bidirectional hybrid with DiffCat, 9 channels; 7,390 for the
  unidirectional hybrid, 6 channels).
- ``bilstm``: a BiLSTM over the per-token representations (supplement A), its final forward and backward
  states concatenated, then Linear -> ReLU -> Dropout -> Linear. With DiffCat each sequence runs through
  the BiLSTM separately and the pooled states are DiffCat-combined.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from distillpipe.config.students import HeadConfig


def diffcat(h_a: torch.Tensor, h_b: torch.Tensor) -> torch.Tensor:
    """DiffCat (CMOW paper, sec. III-C): h = h_a || |h_a - h_b| || h_b. (B, F), (B, F) -> (B, 3F)."""
    return torch.cat([h_a, (h_a - h_b).abs(), h_b], dim=-1)


class Head(nn.Module):
    """Base of all heads: ``pool`` each sequence, DiffCat a pair, then ``classifier``."""

    uses_tokens: bool = False
    """Whether ``pool`` reads ``token_reps`` (else it reads ``seq_enc``)."""
    classifier: nn.Module

    def pool(
        self, seq_enc: torch.Tensor | None, token_reps: torch.Tensor | None, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """One sequence's features (B, P); the sequence-level heads use ``seq_enc`` as it is."""
        if seq_enc is None:
            raise ValueError(f"{type(self).__name__} reads the sequence encoding; got seq_enc=None")
        return seq_enc

    def forward(
        self,
        seq_enc: torch.Tensor | None,
        token_reps: torch.Tensor | None,
        mask: torch.Tensor | None,
        pair: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None] | None = None,
    ) -> torch.Tensor:
        features = self.pool(seq_enc, token_reps, mask)  # (B, P)
        if pair is not None:
            features = diffcat(features, self.pool(*pair))  # (B, 3P)
        return self.classifier(features)  # (B, C)


class LinearHead(Head):
    """Linear probe on the sequence encoding."""

    def __init__(self, in_features: int, num_labels: int) -> None:
        super().__init__()
        self.classifier = nn.Linear(in_features, num_labels)


class MLPHead(Head):
    """One hidden layer with ReLU, dropout and LayerNorm (the paper's MLP head, see the module docstring)."""

    def __init__(self, in_features: int, hidden_size: int, num_labels: int, dropout: float) -> None:
        super().__init__()
        self.classifier = nn.Sequential(
            nn.Linear(in_features, hidden_size),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.LayerNorm(hidden_size),
            nn.Linear(hidden_size, num_labels),
        )


def _conv_out(size: int, kernel: int, stride: int) -> int:
    return (size - kernel) // stride + 1


class _CNNClassifier(nn.Module):
    """Supplement A: a transposed conv upscaling 4x, three unpadded convs (C filters of 4x4, then C+2 filters
    of 3x3 with stride 2, twice), ReLU after each, BatchNorm, flatten, dropout, linear. C = input channels."""

    def __init__(self, parts: int, in_features: int, side: int, num_labels: int, dropout: float) -> None:
        super().__init__()
        self.parts, self.in_features, self.side = parts, in_features, side
        self.per_part = -(-in_features // (side * side))  # ceil: channels of one sequence encoding
        channels = parts * self.per_part
        out = _conv_out(_conv_out(_conv_out(4 * side, 4, 1), 3, 2), 3, 2)
        if out < 1:
            raise ValueError(
                f"cnn head: {side}x{side} matrices are too small for its convolutions "
                f"(need d >= 3); use a larger d or another head type"
            )
        wide = channels + 2
        self.net = nn.Sequential(
            nn.ConvTranspose2d(channels, channels, 4, stride=4),  # (B, C, 4d, 4d)
            nn.ReLU(),
            nn.Conv2d(channels, channels, 4),  # (B, C, 4d-3, 4d-3)
            nn.ReLU(),
            nn.Conv2d(channels, wide, 3, stride=2),
            nn.ReLU(),
            nn.Conv2d(wide, wide, 3, stride=2),  # (B, C+2, out, out)
            nn.ReLU(),
            nn.BatchNorm2d(wide),
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(wide * out * out, num_labels),
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        B, side = features.shape[0], self.side
        parts = features.reshape(B, self.parts, self.in_features)  # (B, parts, F): DiffCat a, |a-b|, b
        parts = F.pad(parts, (0, self.per_part * side * side - self.in_features))  # zero-fill the last channel
        grid = parts.reshape(B, self.parts * self.per_part, side, side)  # (B, C, d, d): row-major, as flattened
        return self.net(grid)


class CNNHead(Head):
    """2D CNN on the aggregated d x d matrices (channels as in the module docstring)."""

    def __init__(self, in_features: int, side: int, num_labels: int, dropout: float, pairs: bool) -> None:
        super().__init__()
        self.classifier = _CNNClassifier(3 if pairs else 1, in_features, side, num_labels, dropout)


class BiLSTMHead(Head):
    """BiLSTM over the per-token representations, then Linear -> ReLU -> Dropout -> Linear (supplement A)."""

    uses_tokens = True

    def __init__(self, token_features: int, hidden_size: int, num_labels: int, dropout: float, pairs: bool) -> None:
        super().__init__()
        self.lstm = nn.LSTM(token_features, hidden_size, batch_first=True, bidirectional=True)
        pooled = 2 * hidden_size * (3 if pairs else 1)
        self.classifier = nn.Sequential(
            nn.Linear(pooled, hidden_size),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden_size, num_labels),
        )

    def pool(
        self, seq_enc: torch.Tensor | None, token_reps: torch.Tensor | None, mask: torch.Tensor | None
    ) -> torch.Tensor:
        if token_reps is None or mask is None:
            raise ValueError("bilstm head reads the per-token representations; got token_reps or mask = None")
        L = token_reps.shape[1]
        lengths = mask.sum(dim=1)  # (B,)
        if not bool((mask == (torch.arange(L, device=mask.device) < lengths[:, None])).all()):
            raise ValueError("bilstm head needs right-padded rows (real tokens first, then padding)")
        # Packing keeps padding out of both directions; an empty row reads one (zero) position.
        packed = pack_padded_sequence(token_reps, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
        _, (h_n, _) = self.lstm(packed)  # h_n: (2, B, H), final forward and backward states
        return torch.cat([h_n[0], h_n[1]], dim=-1)  # (B, 2H)


def build_head(
    cfg: HeadConfig, in_features: int, num_labels: int, *, token_features: int, matrix_side: int | None, pairs: bool
) -> Head:
    """The head named by ``cfg.type``.

    in_features: size of one sequence's encoding ``seq_enc``; token_features: D_tok of ``token_reps``;
    matrix_side: d of the CMOW matrices (None for a student without matrices); pairs: DiffCat inputs.
    """
    if cfg.type == "linear":
        return LinearHead(in_features * (3 if pairs else 1), num_labels)
    if cfg.type == "mlp":
        return MLPHead(in_features * (3 if pairs else 1), cfg.hidden_size, num_labels, cfg.dropout)
    if cfg.type == "cnn":
        if matrix_side is None:
            raise ValueError("cnn head needs CMOW matrices: use variant 'cmow' or 'hybrid', or another head type")
        return CNNHead(in_features, matrix_side, num_labels, cfg.dropout, pairs)
    if cfg.type == "bilstm":
        return BiLSTMHead(token_features, cfg.hidden_size, num_labels, cfg.dropout, pairs)
    raise ValueError(f"unknown head type {cfg.type!r}; known: linear, mlp, cnn, bilstm")
