"""Three evaluated tiny runs (one per task kind and, between them, every architecture that exports), built once."""

import pytest
from _ship_tiny import CMOW, MINIALBERT, WALDORF, export_kwargs, make_run

from distillpipe.ship.export import export_run


@pytest.fixture(scope="session")
def cls_run(tmp_path_factory):
    """Single-sentence classification, CMOW/CBOW-Hybrid (joint, MLP head)."""
    return make_run(tmp_path_factory.mktemp("cls"), "hybrid-toy", task="classification", model=CMOW)


@pytest.fixture(scope="session")
def reg_run(tmp_path_factory):
    """Sentence-pair regression on bins, MiniALBERT with DiffCat encoding and a linear head."""
    return make_run(tmp_path_factory.mktemp("reg"), "minialbert-toy", task="regression", model=MINIALBERT,
                    encoding="diffcat", head="linear")


@pytest.fixture(scope="session")
def qa_run(tmp_path_factory):
    """SQuAD-v2-style QA, WaLDORf."""
    return make_run(tmp_path_factory.mktemp("qa"), "waldorf-toy", task="qa", model=WALDORF)


@pytest.fixture(scope="session")
def exported(tmp_path_factory, cls_run, reg_run, qa_run):
    """Each run exported without ONNX: {kind: folder}."""
    runs = {"classification": cls_run, "regression": reg_run, "qa": qa_run}
    out = {}
    for kind, r in runs.items():
        folder = tmp_path_factory.mktemp("exported") / r["run"]
        export_run(r["run"], **export_kwargs(r, folder))
        out[kind] = folder
    return out
