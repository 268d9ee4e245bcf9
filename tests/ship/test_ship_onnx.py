"""``export --onnx``: for every architecture that exports (CMOW/CBOW-Hybrid, WaLDORf, MiniALBERT), ONNX Runtime
reproduces the PyTorch student within 1e-4 on padded batches of many shapes (dynamic batch and length axes), and
``predict --runtime onnx`` gives the PyTorch runtime's predictions. Exporting costs 10-60 s per student on 2
CPU cores (torch.export and torch.onnx), so only the cheapest runs by default; the others are marked slow."""

import json

import numpy as np
import onnx
import pytest
import torch
from _ship_tiny import export_kwargs
from datasets import load_from_disk
from typer.testing import CliRunner

from distillpipe.cli import app
from distillpipe.ship.export import export_run
from distillpipe.ship.onnx import PARITY_TOLERANCE, probe_batch
from distillpipe.ship.runners import OnnxRunner, TorchRunner, parity

runner = CliRunner()
RUNS = [pytest.param("regression", id="minialbert-diffcat"),
        pytest.param("classification", id="cmow-hybrid", marks=pytest.mark.slow),
        pytest.param("qa", id="waldorf-qa", marks=pytest.mark.slow)]


@pytest.fixture(scope="module")
def onnx_exports():
    """Folders exported with --onnx, by task kind, made once per module (the two tests share them)."""
    return {}


def _exported(kind, runs, cache, tmp_path_factory):
    if kind not in cache:
        r = runs[kind]
        folder = tmp_path_factory.mktemp("onnx") / r["run"]
        export_run(r["run"], **export_kwargs(r, folder, onnx=True))
        cache[kind] = folder
    return cache[kind]


@pytest.fixture
def runs(cls_run, reg_run, qa_run):
    return {"classification": cls_run, "regression": reg_run, "qa": qa_run}


@pytest.mark.parametrize("kind", RUNS)
def test_onnx_reproduces_pytorch_on_padded_batches(kind, runs, onnx_exports, tmp_path_factory):
    folder = _exported(kind, runs, onnx_exports, tmp_path_factory)
    config = json.loads((folder / "config.json").read_text())
    task = runs[kind]["task"]
    graph = onnx.load(str(folder / "model.onnx"))
    for inp in graph.graph.input:  # batch and length are symbolic, not fixed at the traced example's
        dims = inp.type.tensor_type.shape.dim
        assert len(dims) == 2 and dims[0].dim_param and dims[1].dim_param, inp
    model = runs[kind]["model"]
    ours = OnnxRunner(folder / "model.onnx", config["onnx"], torch.device("cpu"))
    reference = TorchRunner(model, torch.device("cpu"), config["onnx"]["outputs"])
    shapes = [[1], [task.max_seq_len], [9, 9], [17, 4, 1], [task.max_seq_len, 30, 12, 2, 1], [3] * 7]
    worst = 0.0
    for seed, lengths in enumerate(shapes):
        batch = probe_batch(task, lengths, seed=100 + seed)
        expected, got = reference(batch), ours(batch)
        assert {k: v.shape for k, v in got.items()} == {k: v.shape for k, v in expected.items()}
        worst = max(worst, parity(expected, got))
    assert worst <= PARITY_TOLERANCE
    assert config["onnx"]["parity_max_difference"] <= PARITY_TOLERANCE


@pytest.mark.parametrize("kind", RUNS)
def test_predict_with_onnx_runtime_equals_pytorch(kind, runs, onnx_exports, tmp_path_factory, tmp_path):
    folder = _exported(kind, runs, onnx_exports, tmp_path_factory)
    test = load_from_disk(str(runs[kind]["prepared"]))["test"]
    columns = {"classification": ["text_a"], "regression": ["text_a", "text_b"], "qa": ["question", "context"]}[kind]
    (tmp_path / "in.txt").write_text("\n".join("\t".join(row) for row in zip(*(test[c] for c in columns))) + "\n")
    out = {}
    for rt in ("torch", "onnx"):
        res = runner.invoke(app, ["predict", str(folder), "--input", str(tmp_path / "in.txt"), "--runtime", rt,
                                  "--out", str(tmp_path / f"{rt}.jsonl")])
        assert res.exit_code == 0, res.output
        out[rt] = [json.loads(line) for line in (tmp_path / f"{rt}.jsonl").read_text().splitlines()]
    assert len(out["onnx"]) == len(test)
    for t, o in zip(out["torch"], out["onnx"]):
        if kind == "classification":
            assert o["label"] == t["label"]
            np.testing.assert_allclose(list(o["probabilities"].values()), list(t["probabilities"].values()),
                                       atol=1e-5)
        elif kind == "regression":
            assert o["score"] == pytest.approx(t["score"], abs=1e-5)
        else:
            assert (o["answer"], o["best_span"]) == (t["answer"], t["best_span"])
            assert o["no_answer_score"] == pytest.approx(t["no_answer_score"], abs=1e-4)
