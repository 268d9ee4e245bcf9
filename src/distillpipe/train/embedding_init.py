"""A student's token embeddings started from the teacher's (``embedding_init: teacher``).

A small student trained for CPU minutes, or a cross-architecture one whose general distillation is short, starts from
token vectors that say nothing about the words. The teacher's input embedding table does (topic, syntax, the
subword pieces of one word). It is wider than the student's (384 for MiniLM, 1,024 for BERT-Large), so it is
projected on its top principal directions: the rows of the centred table ``W - mean(W)`` times the first ``k`` right
singular vectors, which keep the most variance any ``k``-dimensional linear projection keeps (Eckart-Young). This is
how the MiniALBERT paper's rank-312 students start from TinyBERT's table (sec. 3.4) and the CMOW paper's
"pretrained embedding initialisation", across architectures: only the student's token table changes.

The rows keep the teacher's scale (MiniLM's: a standard deviation of ~0.09 over the 64 directions), not the random
initialisation's ``init_std``. Measured on the embedded wiki_pairs (2026-12-02, dev / test accuracy, 1,014 / 996
pairs): the Hybrid DiffCat student 55.8 / 54.8 from random, 57.0 / 55.3 from the teacher's directions rescaled to
its init_std of 0.01, 66.9 / 62.4 at the teacher's scale; MiniALBERT 55.2 / 55.1, 50.1 / 50.0 (rescaled to 0.02: it
collapses to one class), 65.7 / 57.8. Likely why: at 0.01-0.02 the first AdamW steps (~lr = 1e-3 each) are a tenth
of the vectors, and the teacher's structure is gone within tens of steps.

Deterministic: the SVD runs in float64 on the CPU and each direction's sign is fixed (its largest loading is
positive), so the same table gives the same student on any machine (up to the table's own float32 rounding).
"""

from __future__ import annotations

import torch
from torch import nn

from distillpipe.compact import Constants


class EmbeddingInitError(ValueError):
    """The run asks for the teacher's embeddings where there are none, or where the student has no table for them."""


def principal_rows(word: torch.Tensor, width: int) -> torch.Tensor:
    """(V, e) table -> (V, width) float64: its centred rows on its top ``width`` principal directions, each
    direction's sign fixed so that its largest-magnitude loading is positive."""
    if width > word.shape[1] or width > word.shape[0]:
        raise EmbeddingInitError(f"cannot project a {tuple(word.shape)} table on {width} principal directions: the "
                                 f"student's table is wider than the teacher's ({word.shape[1]})")
    x = word.detach().to("cpu", torch.float64)
    x = x - x.mean(dim=0)
    _, _, vh = torch.linalg.svd(x, full_matrices=False)  # rows of vh: directions, by decreasing singular value
    top = vh[:width]  # (width, e)
    sign = torch.sign(top.gather(1, top.abs().argmax(dim=1, keepdim=True)))  # (width, 1)
    return x @ (top * sign).T  # (V, width)


def token_table(student: nn.Module) -> nn.Embedding:
    """The student's table of one vector per teacher token that ``embedding_init`` sets."""
    table = getattr(student, "x_cbow", None) or getattr(student, "tok_emb", None)
    if not isinstance(table, nn.Embedding):
        raise EmbeddingInitError(f"{type(student).__name__} has no token-embedding table to start from the "
                                 "teacher's (embedding_init: teacher is for the Hybrid's CBOW table, WaLDORf and "
                                 "MiniALBERT)")
    return table


def init_from_teacher(student: nn.Module, constants: Constants | None, where: str) -> None:
    """Set the student's token table to the teacher's word table on its principal directions (at the teacher's scale).

    ``constants``: the run's teacher source's (its cache's, or a live teacher's); ``where`` names the run and its
    teacher in errors."""
    if constants is None or constants.embeddings is None:
        raise EmbeddingInitError(
            f"{where}: embedding_init: teacher needs the teacher's embedding tables, which its cache does not hold; "
            "set embeddings: true in its teacher_cache signals (the tables are stored once, 4 bytes x vocabulary x "
            "width), or set embedding_init: random")
    word = constants.embeddings.word
    table = token_table(student)
    if word.shape[0] != table.num_embeddings:
        raise EmbeddingInitError(f"{where}: the teacher's table has {word.shape[0]:,} tokens and the student's "
                                 f"{table.num_embeddings:,}: they must share the tokenizer")
    rows = principal_rows(word, table.embedding_dim)
    with torch.no_grad():
        table.weight.copy_(rows.to(table.weight.dtype))
