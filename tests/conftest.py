"""Test-wide setup: hermetic (no hub, no telemetry) and the location of the shared real-data samples."""

import os
from pathlib import Path

import pytest

# Never reach a hub from tests; fail fast instead.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]


def _find_shared_data() -> Path | None:
    """shared/data beside the clone (CI and the main checkout), or $DISTILLPIPE_SHARED_DATA."""
    candidates = [os.environ.get("DISTILLPIPE_SHARED_DATA"), ROOT.parent / "shared" / "data", "/work/shared/data"]
    for c in candidates:
        if c and (Path(c) / "squad_v2").is_dir():
            return Path(c)
    return None


SHARED_DATA = _find_shared_data()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real-format SQuAD v2 / GLUE samples (tests of the real-data loaders need them)."""
    if SHARED_DATA is None:
        pytest.skip("shared/data (real-format samples) not found beside the repository")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tests use tiny tensors: extra intra-op threads only contend (on a busy 2-core machine a small op
    can wait ~10 ms for a thread, making tests ~10x slower). Subprocesses set OMP_NUM_THREADS=1."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
