"""params.yaml is written the way ``dvc exp run -S`` writes it: DVC's own writer leaves it byte for byte as it is,
and setting one value with DVC's own override function changes exactly that value's line
(``distillpipe params-style`` writes the file so; docs/code-deps.md)."""

import difflib
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from distillpipe.cli import app
from distillpipe.commands.params_style import StyleError, dvc_style

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def params(tmp_path) -> Path:
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    return tmp_path / "params.yaml"


def _changed(before: str, after: str) -> list[str]:
    return [d for d in difflib.ndiff(before.splitlines(), after.splitlines()) if d[:1] in "+-"]


def test_params_yaml_is_a_fixed_point_of_dvcs_writer(params):
    """DVC's YAML round trip (dvc.utils.serialize.modify_yaml: load, change nothing, dump) and its ``-S`` function
    setting nothing (dvc.utils.hydra.apply_overrides, which also re-assigns every list) give the same bytes."""
    from dvc.utils.hydra import apply_overrides
    from dvc.utils.serialize import modify_yaml

    text = params.read_text()
    with modify_yaml(params):
        pass
    assert params.read_text() == text
    apply_overrides(params, [])
    assert params.read_text() == text


@pytest.mark.parametrize(("key", "value", "line"), [
    ("train.runs.waldorf-soft.optim.lr", "0.002", "        lr: 0.002"),                # a float written 1.0e-3
    ("train.runs.waldorf-soft.optim.patience", "3", "        patience: 3"),            # a null (written empty)
    ("teacher_cache.datasets.wiki_qa.signals.pool", "2", "        pool: 2"),           # in a former flow map
    ("train.loader.streams", "2", "  loader: {block_rows: 64, buffer_blocks: 16, streams: 2}"),  # in a flow map
    ("tokenize.datasets.wiki.max_seq_len", "64", "      max_seq_len: 64             # null: the global max_seq_len "
                                                 "above"),                          # a null with a comment
])
def test_setting_one_value_with_dvc_changes_exactly_its_line(params, key, value, line):
    from dvc.utils.hydra import apply_overrides

    text = params.read_text()
    apply_overrides(params, [f"{key}={value}"])
    after = params.read_text()
    changed = _changed(text, after)
    assert len(changed) == 2 and changed[1] == f"+ {line}", changed
    expected = yaml.safe_load(text)
    node = expected
    *path, last = key.split(".")
    for part in path:
        node = node[part]
    node[last] = yaml.safe_load(value)
    assert yaml.safe_load(after) == expected


def test_restyling_keeps_every_value_and_comment_and_reaches_the_fixed_point(params):
    """A params.yaml written by hand (PyYAML's style: nulls spelled out, long flow maps, long lines) comes back
    with the same values and comments, and is then a fixed point of the styling and of DVC's writer."""
    from dvc.utils.serialize import modify_yaml

    data = yaml.safe_load(params.read_text())
    hand = "# a comment on top\n" + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)
    params.write_text(hand)
    res = CliRunner().invoke(app, ["params-style", "--check", "--params", str(params)])
    assert res.exit_code == 1, res.output
    res = CliRunner().invoke(app, ["params-style", "--params", str(params)])
    assert res.exit_code == 0, res.output
    styled = params.read_text()
    assert yaml.safe_load(styled) == data and styled.startswith("# a comment on top\n")
    assert dvc_style(styled) == styled
    with modify_yaml(params):
        pass
    assert params.read_text() == styled
    assert not [line for line in styled.splitlines() if line != line.rstrip()]  # no wrapped flow's trailing spaces


def test_a_comment_dvc_would_drop_is_refused(params):
    """A comment after a list goes with the list, which ``-S`` re-assigns: restyling names it instead of losing it."""
    text = params.read_text()
    assert text.count("        layer_map:\n        - 3\n        - 6\n        schedule:\n") > 1
    params.write_text(text.replace("        layer_map:\n        - 3\n        - 6\n        schedule:\n",
                                   "        layer_map:\n        - 3\n        - 6\n        # why this schedule\n"
                                   "        schedule:\n", 1))
    with pytest.raises(StyleError, match="drops the comment 'why this schedule'"):
        dvc_style(params.read_text(), params)
