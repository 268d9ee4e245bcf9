"""The classification heads of distillpipe's students, for ``transformers`` (``trust_remote_code``): a copy of
``distillpipe/students/heads.py``'s forward passes that needs torch only. Parameter names are distillpipe's, so the
exported ``model.safetensors`` loads as it is.

Every head: ``pool`` one sequence to features (B, P), DiffCat a pair (CMOW paper sec. III-C: [a, |a-b|, b]),
then ``classifier`` -> logits (B, C). ``linear``; ``mlp`` (Linear, ReLU, Dropout, LayerNorm, Linear); ``cnn`` (CMOW
supplement A, on the d x d matrices); ``bilstm`` (supplement A, over the token representations).
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence


def pair_masks(a_input_ids, a_attention_mask, b_input_ids, b_attention_mask):
    """A DiffCat student's (a_mask, b_mask), bool; a ValueError naming the inputs it needs when they are missing."""
    if a_input_ids is None or b_input_ids is None:
        raise ValueError("this student is DiffCat: pass each sentence of a pair tokenized on its own as "
                         "a_input_ids, a_attention_mask, b_input_ids, b_attention_mask (a joint "
                         "[CLS] a [SEP] b [SEP] encoding, as the text-classification pipeline makes, cannot)")
    return a_attention_mask.bool(), b_attention_mask.bool()


def diffcat(h_a, h_b):
    """CMOW paper sec. III-C: h = h_a || |h_a - h_b| || h_b."""
    return torch.cat([h_a, (h_a - h_b).abs(), h_b], dim=-1)


class Head(nn.Module):
    uses_tokens = False

    def pool(self, seq_enc, token_reps, mask):
        return seq_enc

    def forward(self, seq_enc, token_reps, mask, pair=None):
        features = self.pool(seq_enc, token_reps, mask)  # (B, P)
        if pair is not None:
            features = diffcat(features, self.pool(*pair))  # (B, 3P)
        return self.classifier(features)  # (B, C)


class LinearHead(Head):
    def __init__(self, in_features, num_labels):
        super().__init__()
        self.classifier = nn.Linear(in_features, num_labels)


class MLPHead(Head):
    def __init__(self, in_features, hidden_size, num_labels, dropout):
        super().__init__()
        self.classifier = nn.Sequential(nn.Linear(in_features, hidden_size), nn.ReLU(), nn.Dropout(dropout),
                                        nn.LayerNorm(hidden_size), nn.Linear(hidden_size, num_labels))


class _CNNClassifier(nn.Module):
    """Supplement A: transposed conv (4x up), three unpadded convs with ReLU, BatchNorm, flatten, dropout, linear,
    on the sequence encoding laid out row-major as d x d channels (the last one zero-filled)."""

    def __init__(self, parts, in_features, side, num_labels, dropout):
        super().__init__()
        self.parts, self.in_features, self.side = parts, in_features, side
        self.per_part = -(-in_features // (side * side))
        channels, wide = parts * self.per_part, parts * self.per_part + 2
        out = ((4 * side - 3 - 3) // 2 + 1 - 3) // 2 + 1
        self.net = nn.Sequential(
            nn.ConvTranspose2d(channels, channels, 4, stride=4), nn.ReLU(),
            nn.Conv2d(channels, channels, 4), nn.ReLU(),
            nn.Conv2d(channels, wide, 3, stride=2), nn.ReLU(),
            nn.Conv2d(wide, wide, 3, stride=2), nn.ReLU(),
            nn.BatchNorm2d(wide), nn.Flatten(), nn.Dropout(dropout), nn.Linear(wide * out * out, num_labels))

    def forward(self, features):
        B, side = features.shape[0], self.side
        parts = features.reshape(B, self.parts, self.in_features)
        parts = F.pad(parts, (0, self.per_part * side * side - self.in_features))
        return self.net(parts.reshape(B, self.parts * self.per_part, side, side))  # (B, C, d, d) in


class CNNHead(Head):
    def __init__(self, in_features, side, num_labels, dropout, pairs):
        super().__init__()
        self.classifier = _CNNClassifier(3 if pairs else 1, in_features, side, num_labels, dropout)


class BiLSTMHead(Head):
    uses_tokens = True

    def __init__(self, token_features, hidden_size, num_labels, dropout, pairs):
        super().__init__()
        self.lstm = nn.LSTM(token_features, hidden_size, batch_first=True, bidirectional=True)
        self.classifier = nn.Sequential(nn.Linear(2 * hidden_size * (3 if pairs else 1), hidden_size), nn.ReLU(),
                                        nn.Dropout(dropout), nn.Linear(hidden_size, num_labels))

    def pool(self, seq_enc, token_reps, mask):
        lengths = mask.sum(dim=1)  # rows are right-padded (the tokenizer's default)
        packed = pack_padded_sequence(token_reps, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
        _, (h_n, _) = self.lstm(packed)  # (2, B, H): final forward and backward states
        return torch.cat([h_n[0], h_n[1]], dim=-1)  # (B, 2H)


def build_head(head, in_features, num_labels, *, token_features, matrix_side, pairs):
    """``head``: the exported task's head config (type, hidden_size, dropout)."""
    kind, hidden, dropout = head["type"], head["hidden_size"], head["dropout"]
    if kind == "linear":
        return LinearHead(in_features * (3 if pairs else 1), num_labels)
    if kind == "mlp":
        return MLPHead(in_features * (3 if pairs else 1), hidden, num_labels, dropout)
    if kind == "cnn":
        return CNNHead(in_features, matrix_side, num_labels, dropout, pairs)
    if kind == "bilstm":
        return BiLSTMHead(token_features, hidden, num_labels, dropout, pairs)
    raise ValueError(f"unknown head type {kind!r}")
