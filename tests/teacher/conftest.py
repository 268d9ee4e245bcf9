"""Fixtures for the teacher tests: one tiny random teacher per head (helpers in _teacher_tiny)."""

import pytest
from _teacher_tiny import tiny_model


@pytest.fixture(scope="session")
def tiny_teachers():
    """base, mlm, classification (3 labels) and qa tiny BERTs, in eval mode. Tests must not modify them."""
    return {kind: tiny_model(kind, seed=i) for i, kind in enumerate(("base", "mlm", "classification", "qa"))}
