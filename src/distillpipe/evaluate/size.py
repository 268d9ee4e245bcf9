"""Parameter counts of a model, student or teacher (CMOW paper Tables XII-XIII).

Its own module so that ``teacher_finetune`` records its teacher's counts (beside the scores it records for
the ``evaluate`` stage, which then need not load the teacher) without importing the student scoring code.
"""

from __future__ import annotations

from torch import nn


def count_parameters(model: nn.Module) -> dict[str, int]:
    """``{"total": ..., "without_embeddings": ...}`` parameter counts (CMOW paper Tables XII-XIII).

    Embeddings are the parameters of ``nn.Embedding`` / ``nn.EmbeddingBag`` modules (token,
    position, type, CMOW matrix embeddings). Shared or tied parameters are counted once; a weight
    tied to an embedding (e.g. an MLM decoder) counts as embedding.
    """
    params = {id(p): p.numel() for p in model.parameters()}
    embedding = {
        id(p) for m in model.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) for p in m.parameters()
    }
    total = sum(params.values())
    return {"total": total, "without_embeddings": total - sum(params[i] for i in embedding if i in params)}
