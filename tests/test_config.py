"""Config loading: the real params.yaml builds every section; bad params fail naming key and file."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from distillpipe.config.augment import AugmentConfig
from distillpipe.config.base import ConfigError, build
from distillpipe.config.base import load_section as _load_section
from distillpipe.config.evaluate import EvaluateConfig
from distillpipe.config.finetune import FinetuneConfig
from distillpipe.config.prepare import LocalGlueConfig, PrepareConfig
from distillpipe.config.qg_finetune import QgFinetuneConfig
from distillpipe.config.report import ReportConfig
from distillpipe.config.speed import SpeedConfig
from distillpipe.config.teacher_cache import TeacherCacheConfig
from distillpipe.config.teacher_finetune import TeacherFinetuneConfig
from distillpipe.config.teacher_import import TeacherImportConfig
from distillpipe.config.tokenize import TokenizeConfig
from distillpipe.config.train import TrainConfig
from distillpipe.config.train_aug import TrainAugConfig
from distillpipe.config.train_lm import TrainLMConfig
from distillpipe.config.word_vectors import WordVectorsConfig

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params.yaml"
SECTIONS = {
    "prepare": PrepareConfig, "tokenize": TokenizeConfig, "teacher_import": TeacherImportConfig,
    "teacher_finetune": TeacherFinetuneConfig, "teacher_cache": TeacherCacheConfig, "qg_finetune": QgFinetuneConfig,
    "augment": AugmentConfig, "train": TrainConfig, "finetune": FinetuneConfig, "train_aug": TrainAugConfig,
    "evaluate": EvaluateConfig, "speed": SpeedConfig, "report": ReportConfig,
    "word_vectors": WordVectorsConfig, "train_lm": TrainLMConfig,
}


def load_section(name, path):
    return _load_section(path, name, SECTIONS[name])


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
    assert set(raw) == set(SECTIONS), "params.yaml sections and the config sections must agree"
    for name in SECTIONS:
        cfg = load_section(name, PARAMS)
        assert isinstance(cfg, SECTIONS[name])
        # Every leaf came from the file: rebuilding from asdict gives back an equal object.
        assert build(SECTIONS[name], raw[name], name) == cfg
        assert all(dataclasses.is_dataclass(d) for d in _walk(cfg))


def test_config_classes_have_no_defaults():
    seen = set()
    for cls in SECTIONS.values():
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
    raw["prepare"]["local"]["sst2"] = {
        "format": "glue", "task": "sst2", "path": "data/raw/SST-2", "files": {"train": "train.tsv"},
        "encoding": "utf-8", "on_bad_rows": "skip", "carve": None}
    cfg = load_section("prepare", _write(tmp_path, raw))
    assert isinstance(cfg.local["sst2"], LocalGlueConfig) and cfg.dataset("sst2") is cfg.local["sst2"]
    raw["prepare"]["local"]["sst2"]["task"] = "sst3"
    with pytest.raises(ConfigError, match=r"prepare\.local\.sst2\.task: 'sst3' is not one of"):
        load_section("prepare", _write(tmp_path, raw))


@pytest.mark.parametrize("name", ["/abs/train.tsv", "../train.tsv", "sub/../../train.tsv"])
def test_local_files_must_lie_inside_their_folder(tmp_path, raw, name):
    """The folder is what DVC watches: a file outside it could change without re-running anything."""
    raw["prepare"]["local"]["sst2"] = {
        "format": "glue", "task": "sst2", "path": "data/raw/SST-2", "files": {"train": name},
        "encoding": "utf-8", "on_bad_rows": "skip", "carve": None}
    with pytest.raises(ConfigError, match=r"prepare\.local\.sst2: files\.train=.* must be a file name relative"):
        load_section("prepare", _write(tmp_path, raw))


def test_a_dataset_has_one_source(tmp_path, raw):
    raw["prepare"]["local"]["wiki"] = {
        "format": "text", "path": "data/raw/wiki", "files": {"train": "wiki.txt"}, "text_field": "text",
        "encoding": "utf-8", "on_bad_rows": "skip", "carve": None}
    with pytest.raises(ConfigError, match=r"\['wiki'\] named under both prepare\.datasets and prepare\.local"):
        load_section("prepare", _write(tmp_path, raw))


def test_optional_field(tmp_path, raw):
    raw["prepare"]["datasets"]["squad"] = {
        "source": "hub", "name": "squad_v2", "subset": None, "revision": None, "splits": {"train": "train"},
        "text_field": "text",
        "carve": None}
    cfg = load_section("prepare", _write(tmp_path, raw))
    assert cfg.datasets["squad"].subset is None


def test_cross_field_checks(tmp_path, raw):
    raw["tokenize"]["datasets"]["wiki_qa"]["doc_stride"] = 500
    with pytest.raises(ConfigError, match="doc_stride must be in"):
        load_section("tokenize", _write(tmp_path, raw))
    raw = yaml.safe_load(PARAMS.read_text())
    raw["prepare"]["wiki_articles"]["splits"] = {"dev": 0.6, "test": 0.5}
    with pytest.raises(ConfigError, match=r"prepare\.wiki_articles\.splits: split fractions"):
        load_section("prepare", _write(tmp_path, raw))
    raw = yaml.safe_load(PARAMS.read_text())
    raw["teacher_cache"]["datasets"]["wiki"]["signals"]["attn_probs"] = True  # wiki caches no attention layer
    with pytest.raises(ConfigError, match="attn_probs: true keeps the attention probabilities of attn_layers"):
        load_section("teacher_cache", _write(tmp_path, raw))
    raw = yaml.safe_load(PARAMS.read_text())
    raw["tokenize"]["datasets"]["wiki"]["max_seq_len"] = 4
    with pytest.raises(ConfigError, match=r"tokenize\.datasets\.wiki\.max_seq_len=4 is too small"):
        load_section("tokenize", _write(tmp_path, raw))
    raw = yaml.safe_load(PARAMS.read_text())
    raw["tokenize"]["datasets"]["wiki_qa"]["max_seq_len"] = 64  # the window no longer holds question + stride
    with pytest.raises(ConfigError, match=r"tokenize\.datasets\.wiki_qa\.doc_stride must be in"):
        load_section("tokenize", _write(tmp_path, raw))
    raw = yaml.safe_load(PARAMS.read_text())
    del raw["tokenize"]["datasets"]["polarity"]["max_seq_len"]  # explicit: null means the global length
    with pytest.raises(ConfigError, match="max_seq_len"):
        load_section("tokenize", _write(tmp_path, raw))
    raw = yaml.safe_load(PARAMS.read_text())
    raw["teacher_cache"]["datasets"]["wiki"]["max_rows"] = 0
    with pytest.raises(ConfigError, match="max_rows=0 must be >= 1 or null"):
        load_section("teacher_cache", _write(tmp_path, raw))


def test_missing_file_and_section(tmp_path):
    with pytest.raises(ConfigError, match="params file not found"):
        load_section("prepare", tmp_path / "nope.yaml")
    p = tmp_path / "params.yaml"
    p.write_text("tokenize: {}\n")
    with pytest.raises(ConfigError, match="missing section 'prepare'"):
        load_section("prepare", p)
