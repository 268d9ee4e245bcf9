"""Every stage, run as dvc.yaml runs it, with broken inputs: exit status 2, one message, no traceback.

The commands are rendered from dvc.yaml with the first item of each stage group in the real params.yaml, then
run in an empty folder, where every input is missing; then again with an unknown key in the stage's params
section; then with each input present but empty. What a user can break by hand, the CLI reports in one line."""

import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from distillpipe.cli import app

ROOT = Path(__file__).resolve().parents[1]
DVC = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())
# the real params have no local dataset: add one, as a user would, whose folder is not there
PARAMS["prepare"]["local"] = {"mine": {"format": "glue", "task": "sst2", "path": "data/raw/mine",
                                       "files": {"train": "train.tsv", "test": "dev.tsv"}, "encoding": "utf-8",
                                       "on_bad_rows": "error", "carve": {"dev": 0.1, "test": 0.0, "seed": 0}}}
PARAMS["word_vectors"]["local"] = {"cc": {"path": "data/raw/cc.en.300.bin", "center": False}}
runner = CliRunner()


def rendered(stage: dict) -> tuple[list[str], list[str]]:
    """The stage's command and deps for its first item (``${key}``, ``${item.x}`` filled from params.yaml)."""
    key, item = None, None
    if "foreach" in stage:
        path = re.fullmatch(r"\$\{(.+)\}", stage["foreach"]).group(1).split(".")
        entries = PARAMS
        for part in path:
            entries = entries[part]
        key, item = next(iter(entries.items()))
        stage = stage["do"]

    def fill(text: str) -> str:
        return re.sub(r"\$\{item\.(\w+)\}", lambda m: str(item[m.group(1)]), text.replace("${key}", str(key)))

    words = fill(stage["cmd"]).split()
    assert words[:2] == ["python", "-m"] and words[2].startswith("stages."), words
    code = ("fingerprints/",) if words[2] == "stages.fingerprint" else ("src/", "stages/", "fingerprints/")
    data = [fill(d) for d in stage.get("deps", []) if not d.startswith(code)]  # the fingerprint stage reads code
    return [words[2].removeprefix("stages.").replace("_", "-"), *words[3:]], data


STAGES = {name: rendered(stage)[0] for name, stage in DVC.items()}
INPUTS = {name: rendered(stage)[1] for name, stage in DVC.items()}
NEEDS_INPUT = [n for n in STAGES if INPUTS[n]]  # prepare@<embedded> and teacher_import@<embedded> read no file


def run(tmp_path: Path, argv: list[str], params: dict) -> tuple[int, str]:
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    res = runner.invoke(app, argv, catch_exceptions=True, env={"DISTILLPIPE_PROGRESS_SECONDS": "30"})
    text = res.output
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        text += f"\n<uncaught {type(res.exception).__name__}: {res.exception}>"
    return res.exit_code, text


def check_one_message(code: int, text: str, argv: list[str]) -> str:
    assert code == 2, f"{argv}: exit {code}\n{text}"
    assert "Traceback" not in text and "<uncaught" not in text, f"{argv}:\n{text}"
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, f"{argv}: expected one 'error:' line\n{text}"
    return errors[0]


@pytest.mark.parametrize("stage", NEEDS_INPUT)
def test_missing_inputs(stage, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = STAGES[stage]
    message = check_one_message(*run(tmp_path, argv, PARAMS), argv)
    # it names what is missing (a path, or the stage that makes it)
    assert any(d in message for d in INPUTS[stage]) or "run the" in message or "dvc repro" in message, message


@pytest.mark.parametrize("stage", [s for s in STAGES if s != "fingerprint"])  # it reads no params
def test_unknown_params_key(stage, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    section = {"prepare_local": "prepare", "word_vectors_local": "word_vectors"}.get(stage, stage)
    params = yaml.safe_load(yaml.safe_dump(PARAMS))
    params[section]["no_such_key"] = 1
    argv = STAGES[stage]
    message = check_one_message(*run(tmp_path, argv, params), argv)
    assert "no_such_key" in message, message


@pytest.mark.parametrize("stage", NEEDS_INPUT)
def test_empty_inputs(stage, tmp_path, monkeypatch):
    """Every input path exists but is an empty folder (an interrupted copy, a wrong mount)."""
    monkeypatch.chdir(tmp_path)
    argv = STAGES[stage]
    for d in INPUTS[stage]:
        Path(d).mkdir(parents=True, exist_ok=True)
    check_one_message(*run(tmp_path, argv, PARAMS), argv)
