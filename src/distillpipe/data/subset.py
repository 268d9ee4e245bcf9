"""Which rows of a split a capped consumer keeps: evenly spaced from the first to the last.

A corpus is packed in article order, so evenly spaced rows cover every article of it, where the first N would
cover only the first few. Shared by the teacher cache (``teacher_cache.datasets.<name>.max_rows``) and the MLM
corpora's evaluation splits (``tokenize.datasets.<name>.max_eval_blocks``).
"""

from __future__ import annotations

import numpy as np


def row_subset(n: int, max_rows: int | None) -> np.ndarray | None:
    """The rows of an n-row split that at most ``max_rows`` keep: rows ``round(i * (n - 1) / (max_rows - 1))``,
    sorted and distinct; None when all n are kept."""
    if max_rows is None or max_rows >= n:
        return None
    if max_rows == 1:
        return np.zeros(1, dtype=np.int64)
    return np.round(np.arange(max_rows) * ((n - 1) / (max_rows - 1))).astype(np.int64)
