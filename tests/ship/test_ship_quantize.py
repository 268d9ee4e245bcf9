"""``export --quantize dynamic``: an int8 student beside the float one, scored on dev and test with evaluate's code,
refused when its predictions differ beyond tolerance (ship/quantize.py). The refusal is shown with a deliberately
broken quantizer (ONNX Runtime's real quantization, then every int8 weight zeroed): the check that refuses it is
export's own."""

import json

import numpy as np
import onnx
import pytest
import torch
from _ship_tiny import ELMO, export_kwargs
from datasets import load_from_disk
from onnx import numpy_helper
from typer.testing import CliRunner

from distillpipe.cli import app
from distillpipe.config.base import build
from distillpipe.config.students import ElmoConfig
from distillpipe.evaluate.size import count_parameters
from distillpipe.ship import quantize as quantize_module
from distillpipe.ship.bundle import load_model
from distillpipe.ship.export import export_run
from distillpipe.ship.predict import Predictor, Row
from distillpipe.ship.quantize import INT8_ONNX_FILE, INT8_TORCH_FILE, MAX_DISAGREEMENT, QuantizeError, judge
from distillpipe.students import build_student, save_student

runner = CliRunner()


@pytest.mark.slow  # ~25 s on 2 shared cores (torch.export and torch.onnx, then the int8 graph and its checks)
def test_int8_onnx_export_scores_and_predicts(reg_run, tmp_path):
    folder = tmp_path / "int8"
    summary = export_run(reg_run["run"], **export_kwargs(reg_run, folder, quantize="dynamic"))
    config = json.loads((folder / "config.json").read_text())
    q = config["quantized"]
    assert config["onnx"] is not None  # --quantize implies the float graph
    assert q["file"] == INT8_ONNX_FILE and (folder / INT8_ONNX_FILE).stat().st_size == q["bytes"]
    assert q["bytes"] < q["float_bytes"]
    assert [c["split"] for c in q["checks"]] == ["dev", "test"]
    for c in q["checks"]:
        assert c["examples"] == 24 and 1 - c["agreement"] <= max(MAX_DISAGREEMENT, 1 / 24)
    assert set(q["speed"]["sentences_per_s"]) == {"1", "32"}
    card = (folder / "README.md").read_text()
    assert "## int8" in card and "| dev | 24 |" in card and "--runtime onnx-int8" in card
    assert "int8" in summary.one_line()

    test = load_from_disk(str(reg_run["prepared"]))["test"]
    (tmp_path / "in.txt").write_text("\n".join(f"{a}\t{b}" for a, b in zip(test["text_a"], test["text_b"])) + "\n")
    res = runner.invoke(app, ["predict", str(folder), "--input", str(tmp_path / "in.txt"), "--runtime", "onnx-int8",
                              "--out", str(tmp_path / "int8.jsonl")])
    assert res.exit_code == 0, res.output
    records = [json.loads(line) for line in (tmp_path / "int8.jsonl").read_text().splitlines()]
    assert len(records) == len(test) and all("score" in r for r in records)
    res = runner.invoke(app, ["predict", str(folder), "--text", "w1\tw2", "--runtime", "torch-int8"])
    assert res.exit_code != 0 and "model.int8.onnx (--runtime onnx-int8)" in res.output


def test_int8_torch_module_where_onnx_cannot_go(cls_run, tmp_path):
    """ELMo (no ONNX): the int8 student is torch's dynamic quantization of its Linear layers, saved and rebuilt."""
    record = json.loads((cls_run["student"] / "student.json").read_text())
    cfg = build(ElmoConfig, ELMO, "model")
    torch.manual_seed(0)
    elmo = build_student(cfg, cls_run["task"]).eval()
    elmo.input_vectors.normal_()
    save_student(tmp_path / "elmo", elmo, cfg, cls_run["task"], record["record"])
    metrics = json.loads(cls_run["metrics"].read_text())
    metrics["params"] = count_parameters(elmo)  # the records of this student (a test stand-in for its evaluate)
    (tmp_path / "m.json").write_text(json.dumps(metrics))
    out = tmp_path / "out"
    export_run("hybrid-toy", **export_kwargs(cls_run, out, student_dir=tmp_path / "elmo",
                                             metrics_path=tmp_path / "m.json", quantize="dynamic"))
    config = json.loads((out / "config.json").read_text())
    q = config["quantized"]
    assert config["onnx"] is None and q["file"] == INT8_TORCH_FILE and q["runtime"] == "PyTorch"
    assert all(c["examples"] == 24 for c in q["checks"])
    assert "--runtime torch-int8" in (out / "README.md").read_text()
    got, _ = Predictor(out, runtime="torch-int8").predict([Row(1, ("w11 w12",)), Row(2, ("w30 w31 w32",))])
    model, _ = load_model(out, torch.device("cpu"))
    int8 = quantize_module.load_torch_int8(model, out / INT8_TORCH_FILE)
    assert any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in int8.modules())
    with torch.inference_mode():
        ids = torch.tensor([[2, 16, 17, 3, 0], [2, 35, 36, 37, 3]])  # [CLS] w11 w12 [SEP], [CLS] w30 w31 w32 [SEP]
        batch = {"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 1, 1, 0], [1] * 5]).bool()}
        probs = torch.softmax(int8(batch).logits, -1)
        float_probs = torch.softmax(model(batch).logits, -1)
    assert [v for r in got for v in r["probabilities"].values()] == pytest.approx(probs.flatten().tolist(), abs=1e-4)
    assert not torch.equal(probs, float_probs)  # it is the int8 module that ran
    (out / INT8_TORCH_FILE).write_bytes((out / INT8_TORCH_FILE).read_bytes() + b"x")  # damaged: refused
    with pytest.raises(QuantizeError, match="does not match the sha256"):
        Predictor(out, runtime="torch-int8")


def _zeroing_quantizer(real):
    def broken(float_path, int8_path):
        real(float_path, int8_path)  # ONNX Runtime's own quantization ...
        model = onnx.load(str(int8_path))
        zeroed = 0
        for init in model.graph.initializer:  # ... then every int8 weight zeroed
            if init.data_type == onnx.TensorProto.INT8:
                init.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(init)), init.name))
                zeroed += 1
        assert zeroed > 0
        onnx.save(model, str(int8_path))
    return broken


def test_int8_export_refuses_a_broken_quantization(reg_run, tmp_path, monkeypatch):
    monkeypatch.setattr(quantize_module, "quantize_onnx_graph",
                        _zeroing_quantizer(quantize_module.quantize_onnx_graph))
    folder = tmp_path / "broken"
    with pytest.raises(QuantizeError, match=r"dev: \d+ of 24 predictions .* differ from the float student's"):
        export_run(reg_run["run"], **export_kwargs(reg_run, folder, quantize="dynamic"))
    assert not folder.exists() and not (tmp_path / "broken.partial").exists()


def _check(n_wrong: int, n_fixed: int, n: int):
    """int8 vs float on ``n`` examples: the int8 student gets ``n_wrong`` examples wrong that the float one got
    right, and ``n_fixed`` right that it got wrong; the rest the same."""
    gold = [i % 2 for i in range(n)]
    base = [1 - g if n_wrong <= i < n_wrong + n_fixed else g for i, g in enumerate(gold)]
    q = [1 - b if i < n_wrong + n_fixed else b for i, b in enumerate(base)]

    def records(preds):
        return [{"id": str(i), "gold": g, "pred": p} for i, (g, p) in enumerate(zip(gold, preds))]

    return judge("accuracy", "classification", {"dev": records(base)}, {"dev": records(q)}, bin_width=None,
                 n_resamples=200, confidence=0.95, seed=0)[0]


def test_judge_tolerance_on_records():
    """The tolerance itself, on records with known flips: one flip in 20 passes (one example is always allowed),
    two do not; 2% of 1,000 passes, 3% does not; a one-sided drop that McNemar finds significant is refused even
    within the agreement bound."""
    assert _check(1, 0, 20).problems == ()
    two = _check(2, 0, 20)
    assert two.agreement == 0.9 and len(two.problems) == 1 and "2 of 20 predictions" in two.problems[0]
    assert _check(10, 10, 1000).problems == ()
    assert any("30 of 1000" in p for p in _check(15, 15, 1000).problems)
    drop = _check(20, 0, 1000)  # 2% flips, all to wrong: within the agreement bound, McNemar p ~ 2e-6
    assert drop.agreement == 0.98 and len(drop.problems) == 1 and "McNemar" in drop.problems[0]


@pytest.mark.slow  # ~30 s: WaLDORf's ONNX export
def test_int8_onnx_export_of_a_qa_student(qa_run, tmp_path):
    """QA: the int8 graph scored with the dev-tuned threshold on both splits (as predict applies it); predict runs
    it."""
    folder = tmp_path / "qa-int8"
    export_run(qa_run["run"], **export_kwargs(qa_run, folder, quantize="dynamic"))
    q = json.loads((folder / "config.json").read_text())["quantized"]
    assert [c["split"] for c in q["checks"]] == ["dev", "test"] and q["metric"] == "f1"
    test = load_from_disk(str(qa_run["prepared"]))["test"]
    rows = [Row(i + 1, (question, context)) for i, (question, context) in enumerate(zip(test["question"],
                                                                                          test["context"]))]
    records, _ = Predictor(folder, runtime="onnx-int8").predict(rows)
    assert len(records) == len(rows) and all("answer" in r for r in records)
