"""``distillpipe export``: the folder round-trips the student, loads with neither DVC, Zarr nor datasets, refuses
damage, carries a card built from the records, and refuses what it cannot export with a message that says why."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from _ship_tiny import ELMO, export_kwargs
from typer.testing import CliRunner

from distillpipe.cli import app
from distillpipe.ship.bundle import BundleError, load_model, read_config
from distillpipe.ship.export import ExportError, export_run
from distillpipe.ship.predict import Predictor, Row
from distillpipe.students import save_student

runner = CliRunner()


@pytest.mark.parametrize("kind", ["classification", "regression", "qa"])
def test_round_trip_gives_the_same_module(kind, exported, cls_run, reg_run, qa_run):
    r = {"classification": cls_run, "regression": reg_run, "qa": qa_run}[kind]
    model, config = load_model(exported[kind], torch.device("cpu"))
    assert type(model) is type(r["model"]) and not model.training
    mine, theirs = model.state_dict(), r["model"].state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert config["model"] == r["config"] and config["task_type"] == kind and config["run"] == r["run"]
    files = {p.name for p in exported[kind].iterdir()}
    assert {"config.json", "model.safetensors", "README.md", "tokenizer.json", "vocab.txt"} <= files
    assert "model.onnx" not in files and config["onnx"] is None


def test_card_is_built_from_the_records(cls_run, exported):
    card = (exported["classification"] / "README.md").read_text()
    metrics = json.loads(cls_run["metrics"].read_text())
    test_acc = f"{100 * metrics['test']['accuracy']:.1f}"
    teacher_acc = f"{100 * metrics['teacher']['test']['accuracy']:.1f}"
    assert f"| {test_acc} [" in card and f"| {teacher_acc} [" in card  # scores with their intervals
    for expected in ("teacher `toy_classification`", "## Speed", "Not measured", "finetune.runs.hybrid-toy",
                     "pipeline commit: unknown", "library_name: transformers", "dev 24, test 24, train 8",
                     "huggingface_hub.upload_folder", metrics["student"]):
        assert expected in card, expected
    # the same code fingerprint as the run's checkpoints (train/build.py's run_identity)
    from distillpipe.identity import code_identity, stage_code
    from distillpipe.train.build import CODE_STAGES

    code = code_identity(stage_code(*CODE_STAGES, student="cmow_hybrid"))
    assert f"training code fingerprint `{code}`" in card


def test_card_names_the_commit_and_the_speed(cls_run, tmp_path):
    root = cls_run["root"]
    speed = {"run": "hybrid-toy", "device": "cpu", "batch_size": 256, "seq_len": 64, "student_sentences_per_s": 9000.0,
             "teacher_sentences_per_s": 300.0, "speedup": 30.0}
    (tmp_path / "speed.json").write_text(json.dumps(speed))
    git = ["git", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x"],
                   check=True)
    sha = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    export_run("hybrid-toy", **export_kwargs(cls_run, tmp_path / "out", speed_path=tmp_path / "speed.json",
                                             root=tmp_path))
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"pipeline commit: `{sha}`" in card and "(with uncommitted changes)" not in card
    assert "9,000 sentences/s vs the teacher's 300 (30.0x)" in card
    assert root.exists()


def test_loads_without_dvc_zarr_or_datasets(exported):
    """In a fresh interpreter where importing dvc, zarr, dask or datasets fails, the folder loads and predicts."""
    code = textwrap.dedent(f"""
        import sys
        for name in ("dvc", "zarr", "numcodecs", "dask", "distributed", "datasets", "dvclive"):
            sys.modules[name] = None  # makes `import name` raise ImportError
        from distillpipe.ship.predict import Predictor, Row
        p = Predictor({str(exported["qa"])!r})
        records, _ = p.predict([Row(1, ("w1 w2 w9", "w20 w9 w33 w40 w41"))])
        assert "answer" in records[0], records
        print("ok", records[0]["has_answer"])
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path), "HF_HUB_OFFLINE": "1",
                              "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0 and res.stdout.startswith("ok"), res.stderr[-3000:]


def test_damaged_or_foreign_folders_are_refused(exported, tmp_path):
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(exported["classification"], folder)
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="model.safetensors does not match the sha256"):
        load_model(folder, torch.device("cpu"))
    (folder / "vocab.txt").write_text("[PAD]\n")
    with pytest.raises(BundleError, match="tokenizer files .* do not match"):
        Predictor(folder)
    with pytest.raises(BundleError, match="not an exported student"):
        read_config(tmp_path)
    res = runner.invoke(app, ["predict", str(tmp_path), "--text", "w1"])
    assert res.exit_code == 2 and "not an exported student" in res.output


def test_export_refuses_what_it_cannot_ship(cls_run, tmp_path):
    kw = export_kwargs(cls_run, tmp_path / "out")
    with pytest.raises(ExportError, match=r"evaluate@hybrid-toy"):
        export_run("hybrid-toy", **(kw | {"metrics_path": tmp_path / "none.json"}))
    with pytest.raises(ExportError, match="holds the run 'hybrid-toy', not 'other'"):
        export_run("other", **kw)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match="exists and is not an exported student"):
        export_run("hybrid-toy", **(kw | {"out_dir": tmp_path / "taken"}))
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"
    # a general-distilled (MLM) student: there is nothing to predict
    student = cls_run["model"]
    record = json.loads((cls_run["student"] / "student.json").read_text())
    mlm = tmp_path / "mlm"
    from distillpipe.config.base import build
    from distillpipe.config.students import CMOWHybridConfig
    from distillpipe.students import build_student
    from distillpipe.students.base import TaskSpec

    spec = TaskSpec("mlm", student.task.vocab_size, 32, 0, 0, "joint", None)
    cfg = build(CMOWHybridConfig, record["model"], "model")
    save_student(mlm, build_student(cfg, spec), cfg, spec, record["record"])
    with pytest.raises(ExportError, match="general-distilled cmow_hybrid .* export a task student"):
        export_run("hybrid-toy", **(kw | {"student_dir": mlm}))
    # no half-written folder is left behind by any of these
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_elmo_exports_for_pytorch_and_is_refused_for_onnx_with_the_reason(cls_run, tmp_path):
    from distillpipe.config.base import build
    from distillpipe.config.students import ElmoConfig
    from distillpipe.students import build_student

    record = json.loads((cls_run["student"] / "student.json").read_text())
    student = cls_run["model"]
    cfg = build(ElmoConfig, ELMO, "model")
    torch.manual_seed(0)
    elmo = build_student(cfg, student.task).eval()
    elmo.input_vectors.normal_()
    d = tmp_path / "elmo"
    save_student(d, elmo, cfg, student.task, record["record"])
    metrics = json.loads(cls_run["metrics"].read_text())
    from distillpipe.evaluate.size import count_parameters

    metrics["params"] = count_parameters(elmo)  # the records of this student (a test stand-in for its evaluate)
    (tmp_path / "m.json").write_text(json.dumps(metrics))
    kw = export_kwargs(cls_run, tmp_path / "out", student_dir=d, metrics_path=tmp_path / "m.json")
    with pytest.raises(ExportError, match="ONNX's LSTM operator has none"):
        export_run("hybrid-toy", **(kw | {"onnx": True}))
    export_run("hybrid-toy", **kw)
    p = Predictor(tmp_path / "out")
    records, _ = p.predict([Row(1, ("w11 w12",)), Row(2, ("w30 w31 w32",))])
    with torch.inference_mode():
        model, _ = load_model(tmp_path / "out", torch.device("cpu"))
        ids = torch.tensor([[2, 16, 17, 3, 0], [2, 35, 36, 37, 3]])  # [CLS] w11 w12 [SEP], [CLS] w30 w31 w32 [SEP]
        logits = model({"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 1, 1, 0], [1] * 5]).bool()}).logits
    assert [r["label_id"] for r in records] == logits.argmax(-1).tolist()
    res = runner.invoke(app, ["predict", str(tmp_path / "out"), "--runtime", "onnx", "--text", "w11"])
    assert res.exit_code == 2 and "cannot be exported to ONNX" in res.output and "--runtime torch" in res.output
