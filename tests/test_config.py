"""Config loading: the real params.yaml builds every section; bad params fail naming key and file."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from distillpipe import config
from distillpipe.config import ConfigError, load_section

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params.yaml"


def _walk(obj):
    """Yield every dataclass instance inside obj (recursively through dicts/lists)."""
    if dataclasses.is_dataclass(obj):
        yield obj
        for f in dataclasses.fields(obj):
            yield from _walk(getattr(obj, f.name))
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v)


def test_every_section_of_real_params_loads():
    raw = yaml.safe_load(PARAMS.read_text())
    assert set(raw) == set(config.SECTIONS), "params.yaml sections and config.SECTIONS must agree"
    for name in config.SECTIONS:
        cfg = load_section(name, PARAMS)
        assert isinstance(cfg, config.SECTIONS[name])
        # Every leaf came from the file: rebuilding from asdict gives back an equal object.
        assert config.build(config.SECTIONS[name], raw[name], name) == cfg
        assert all(dataclasses.is_dataclass(d) for d in _walk(cfg))


def test_config_classes_have_no_defaults():
    seen = set()
    for cls in config.SECTIONS.values():
        stack = [cls]
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            for f in dataclasses.fields(c):
                assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, (
                    f"{c.__name__}.{f.name} has a default in code; params.yaml must be the single source")
            for t in _nested_types(c):
                stack.append(t)
    assert len(seen) > 5


def _nested_types(cls):
    import typing
    out = []
    def visit(t):
        if dataclasses.is_dataclass(t):
            out.append(t)
        for a in typing.get_args(t):
            visit(a)
    for t in typing.get_type_hints(cls).values():
        visit(t)
    return out


def _write(tmp_path, data):
    p = tmp_path / "params.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.fixture
def raw():
    return yaml.safe_load(PARAMS.read_text())


def test_unknown_key_names_path_and_file(tmp_path, raw):
    raw["tokenize"]["datasets"]["wiki"]["mask_veiws"] = 3
    p = _write(tmp_path, raw)
    with pytest.raises(ConfigError, match=r"params\.yaml: tokenize\.datasets\.wiki: unknown key\(s\) \['mask_veiws'\]"):
        load_section("tokenize", p)


def test_missing_key_names_path(tmp_path, raw):
    del raw["prepare"]["datasets"]["polarity"]["encoding"]
    p = _write(tmp_path, raw)
    with pytest.raises(ConfigError, match=r"prepare\.datasets\.polarity: missing key\(s\) \['encoding'\]"):
        load_section("prepare", p)


@pytest.mark.parametrize("key, value, expect", [
    ("max_seq_len", "128", "tokenize.max_seq_len: expected an integer"),
    ("max_seq_len", True, "tokenize.max_seq_len: expected an integer"),
    ("max_seq_len", 1.5, "tokenize.max_seq_len: expected an integer"),
    ("tokenizer", 3, "tokenize.tokenizer: expected a string"),
    ("datasets", [1], "tokenize.datasets: expected a mapping"),
])
def test_wrong_type_names_path(tmp_path, raw, key, value, expect):
    raw["tokenize"][key] = value
    with pytest.raises(ConfigError, match=expect.replace(".", r"\.")):
        load_section("tokenize", _write(tmp_path, raw))


def test_float_accepts_int_but_not_bool(tmp_path, raw):
    raw["tokenize"]["datasets"]["wiki"]["mask_prob"] = 0
    with pytest.raises(ConfigError, match="mask_prob=0.0 must be in"):
        load_section("tokenize", _write(tmp_path, raw))
    raw["tokenize"]["datasets"]["wiki"]["mask_prob"] = True
    with pytest.raises(ConfigError, match="expected a number"):
        load_section("tokenize", _write(tmp_path, raw))


def test_tagged_union_unknown_kind(tmp_path, raw):
    raw["prepare"]["datasets"]["wiki"]["source"] = "ftp"
    with pytest.raises(ConfigError, match=r"prepare\.datasets\.wiki: .*matches no known kind.*source=embedded"):
        load_section("prepare", _write(tmp_path, raw))


def test_tagged_union_picks_variant_and_checks_its_keys(tmp_path, raw):
    raw["prepare"]["datasets"]["sst2"] = {
        "source": "local", "format": "glue", "task": "sst2", "files": {"train": "x.tsv"},
        "encoding": "utf-8", "on_bad_rows": "skip"}
    cfg = load_section("prepare", _write(tmp_path, raw))
    assert isinstance(cfg.datasets["sst2"], config.LocalGlueConfig)
    raw["prepare"]["datasets"]["sst2"]["task"] = "sst3"
    with pytest.raises(ConfigError, match=r"prepare\.datasets\.sst2\.task: 'sst3' is not one of"):
        load_section("prepare", _write(tmp_path, raw))


def test_optional_field(tmp_path, raw):
    raw["prepare"]["datasets"]["squad"] = {
        "source": "hub", "name": "squad_v2", "subset": None, "splits": {"train": "train"}, "text_field": "text"}
    cfg = load_section("prepare", _write(tmp_path, raw))
    assert cfg.datasets["squad"].subset is None


def test_cross_field_checks(tmp_path, raw):
    raw["tokenize"]["datasets"]["wiki_qa"]["doc_stride"] = 500
    with pytest.raises(ConfigError, match="doc_stride must be in"):
        load_section("tokenize", _write(tmp_path, raw))
    raw = yaml.safe_load(PARAMS.read_text())
    raw["prepare"]["datasets"]["wiki"]["splits"] = {"dev": 0.6, "test": 0.5}
    with pytest.raises(ConfigError, match=r"prepare\.datasets\.wiki\.splits: split fractions"):
        load_section("prepare", _write(tmp_path, raw))


def test_missing_file_and_section(tmp_path):
    with pytest.raises(ConfigError, match="params file not found"):
        load_section("prepare", tmp_path / "nope.yaml")
    p = tmp_path / "params.yaml"
    p.write_text("tokenize: {}\n")
    with pytest.raises(ConfigError, match="missing section 'prepare'"):
        load_section("prepare", p)
