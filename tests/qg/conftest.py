"""Fixtures for the qg tests: a tiny QA set and a tiny question generator fine-tuned on it (once per session)."""

import pytest
from _qg_tiny import qg_params, write_qa


@pytest.fixture(scope="session")
def toy_qa(tmp_path_factory):
    return write_qa(tmp_path_factory.mktemp("qa") / "toy_qa")


@pytest.fixture(scope="session")
def tiny_qg(tmp_path_factory, toy_qa):
    """A tiny generator written by qg_finetune itself (1 epoch): the augment tests' input."""
    from distillpipe.config.base import build
    from distillpipe.config.qg_finetune import QgFinetuneConfig
    from distillpipe.qg.finetune import finetune_qg

    root = tmp_path_factory.mktemp("qg")
    cfg = build(QgFinetuneConfig, qg_params(), "qg_finetune")
    finetune_qg(toy_qa, cfg, root / "qg", root / "ckpt", root / "metrics.json")
    return root / "qg"
