"""The model card (``README.md`` of an exported student), generated from the run's records: what it was distilled
from and on, its dev/test scores beside the teacher's with the report's bootstrap intervals (the same numbers as
``reports/results.md``: :class:`distillpipe.evaluate.tables.Scorer`), its size and speed, the params of its run,
and the pipeline commit. Nothing in it is typed by hand; a record that is missing is said to be missing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from distillpipe.evaluate.tables import NA, Bootstrap, Row, Scorer, format_metric
from distillpipe.ship import card_meta
from distillpipe.ship.quantize import card_lines as int8_lines
from distillpipe.ship.remote_code import card_lines

ARCHITECTURES = {
    "cmow_hybrid": "CMOW/CBOW-Hybrid (matrix embeddings, CMOW paper)",
    "waldorf": "WaLDORf (conv + transformer reader, WaLDORf paper)",
    "minialbert": "MiniALBERT (recursive transformer with adapters)",
    "elmo": "ELMo biLM features",  # the variant from ELMO_VARIANTS
}
ELMO_VARIANTS = {"continuous": "ELMo-C biLM features (continuous outputs)",
                 "adaptive": "ELMo-A biLM features (adaptive softmax)",
                 "subword": "ELMo-Sub biLM features (full softmax over subwords)"}
"""An ELMo student by the output layer its language model was trained with (``model.output``)."""
QA_METRICS = ("exact", "f1", "HasAns_f1", "NoAns_exact")


@dataclass(frozen=True)
class CardInputs:
    run: str
    config: Mapping[str, Any]
    """The exported folder's config.json."""
    record: Mapping[str, Any]
    """The student's training record (student.json's ``record``)."""
    metrics: Mapping[str, Any]
    """``metrics/students/<run>.json`` (the evaluate stage)."""
    predictions: Mapping[str, Any]
    """``predictions/<run>.json``: the per-example records the intervals are drawn from."""
    speed: Mapping[str, Any] | None
    """``metrics/speed/<run>.json``, or None when the run is not among ``speed.runs``."""
    params: Mapping[str, Any]
    """The whole params.yaml."""
    tokens_meta: Mapping[str, Any]
    commit: str
    """The pipeline commit, as :func:`distillpipe.ship.export.pipeline_commit` describes it."""
    bootstrap: Bootstrap
    folder: str
    """The exported folder's name (for the usage lines)."""
    license: str
    """The license the front matter declares (:func:`distillpipe.ship.card_meta.choose_license`)."""
    license_source: str
    """Where it came from, in words."""
    origin: card_meta.TeacherOrigin
    """The base teacher's spec, Hub id and license."""


def _row(run: str, who: str, inp: CardInputs) -> Row:
    m = inp.metrics
    part = m if who == "student" else m["teacher"]
    records = {s: inp.predictions[who][s] for s in ("dev", "test") if (inp.predictions.get(who) or {}).get(s)}
    return Row(run=run, dataset=m["dataset"], model=m["student"] if who == "student" else part["name"], note="",
               task_type=m["task_type"], primary_metric=m["primary_metric"], dev=part.get("dev"),
               test=part.get("test"), params=part.get("params"), sentences_per_s=None, speedup=None, device=NA,
               records=records)


def _millions(n: Any) -> str:
    return f"{n / 1e6:.2f} M" if isinstance(n, int) else NA


def _run_params(params: Mapping[str, Any], run: str) -> tuple[str, Any] | None:
    for section in ("finetune", "train", "train_aug", "train_lm"):
        runs = (params.get(section) or {}).get("runs") or {}
        if run in runs:
            return section, runs[run]
    return None


def _yaml(obj: Any) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=None, width=110).rstrip()


def render_card(inp: CardInputs) -> str:
    c, m, rec = inp.config, inp.metrics, inp.record
    run, dataset, task_type = inp.run, m["dataset"], m["task_type"]
    arch = (ELMO_VARIANTS[c["model"]["output"]] if c["student"] == "elmo"
            else ARCHITECTURES.get(c["student"], c["student"]))
    teacher = m["teacher"]
    metric = m["primary_metric"]
    scorer = Scorer(inp.bootstrap)
    student_row, teacher_row = _row(run, "student", inp), _row(f"teacher:{dataset}", "teacher", inp)
    meta = card_meta.front_matter(run=run, config=c, metrics=m, params=inp.params, license=inp.license,
                                  origin=inp.origin)
    lines = [*card_meta.render(meta), "", f"# {run}: a distilled {arch} for `{dataset}` ({task_type})", ""]
    if rec.get("note"):
        lines += [str(rec["note"]), ""]
    lines += [f"Distilled with distillpipe from the teacher `{teacher['name']}` "
              f"({_millions((teacher.get('params') or {}).get('total'))} parameters) on the dataset `{dataset}`. "
              f"This folder is self-contained: weights (`model.safetensors`), `config.json`, the tokenizer's files"
              f"{', `model.onnx`' if c.get('onnx') else ''} and this card. It needs only `distillpipe` installed "
              "(no DVC, Zarr or datasets).", "",
              f"License: `{inp.license}`, {inp.license_source}; the terms of the data it was distilled on "
              f"(`{dataset}`) may add to it." + (f" Base model (`base_model`): `{inp.origin.hub_id}`, the Hub model "
                                                  f"the teacher was imported from (`{inp.origin.spec}`), fine-tuned "
                                                  "on the task by the pipeline." if inp.origin.hub_id else ""), ""]

    lines += ["## Scores", "",
              f"Primary metric `{metric}` in percent, with 95% bootstrap intervals over the split's examples "
              f"(BCa, {inp.bootstrap.n_resamples:,} resamples, seed {inp.bootstrap.seed}: the numbers of "
              "`reports/results.md`).", "",
              "| model | parameters | dev | test |", "|---|---|---|---|"]
    for label, row in ((f"this student ({c['student']})", student_row), (f"teacher `{teacher['name']}`", teacher_row)):
        lines.append(f"| {label} | {_millions((row.params or {}).get('total'))} | {scorer.cell(row, 'dev', metric)} | "
                     f"{scorer.cell(row, 'test', metric)} |")
    lines.append("")
    if task_type == "qa":
        lines += ["SQuAD v2 metric; the no-answer threshold is tuned on dev (so dev is optimistic) and applied to "
                  f"test, and to every prediction of this folder (`{c['qa']['threshold']:.4g}`).", ""]
        for split in ("dev", "test"):
            if m.get(split):
                parts = [f"{k} {format_metric(m[split].get(k), task_type)}" for k in QA_METRICS if k in m[split]]
                lines.append(f"- {split}: " + ", ".join(parts))
        lines.append("")
    else:
        for split in ("dev", "test"):
            if m.get(split):
                parts = [f"{k} {format_metric(v, task_type)}" for k, v in sorted(m[split].items())
                         if isinstance(v, float)]
                lines.append(f"- {split} (all metrics, %): " + ", ".join(parts))
        lines.append("")
    lines += ["The front matter's `model-index` carries every dev/test score of the student as the evaluate stage "
              "records it (" + ("SQuAD v2's EM and F1 in percent" if task_type == "qa" else "as fractions, not percent")
              + "), so that a Hub page lists them.", ""]
    p = m.get("params") or {}
    lines += [f"Parameters: {p.get('total', 0):,} ({p.get('without_embeddings', 0):,} without embeddings); "
              f"trained {rec.get('trainable_params') or 0:,} of them.", ""]

    lines += ["## Speed", ""]
    s = inp.speed
    if s:
        lines += [f"The `speed` stage (PyTorch eager, random batches of {s['batch_size']} x {s['seq_len']} tokens, "
                  f"{s['device']}): {s['student_sentences_per_s']:,.0f} sentences/s vs the teacher's "
                  f"{s['teacher_sentences_per_s']:,.0f} ({s['speedup']:.1f}x). `benchmarks/student_inference.py` "
                  "compares PyTorch and ONNX Runtime at batch 1 and 32.", ""]
    else:
        lines += ["Not measured for this run (the `speed` stage times the runs listed under `speed.runs`, one per "
                  "architecture: a student's speed depends on its architecture and size, not its weights).", ""]

    lines += int8_lines(c, inp.folder)  # export --quantize (ship/quantize.py)

    lines += ["## Data", ""]
    summary = inp.tokens_meta.get("summary") or {}
    sizes = ", ".join(f"{k} {v:,}" for k, v in (summary.get("examples") or {}).items())
    source = _dataset_source(inp.params, dataset)
    lines += [f"`{dataset}` ({task_type}): {sizes or 'split sizes not recorded'} examples.",
              f"Tokenized with `{inp.tokens_meta['tokenizer']['spec']}` (tokenizer sha256 "
              f"`{c['tokenizer']['sha256'][:16]}`), at most {c['max_length']} tokens"
              + (f", QA windows with doc stride {c['qa']['doc_stride']} and questions of at most "
                 f"{c['qa']['max_query_len']} tokens" if c.get("qa") else "") + "."]
    if source is not None:
        lines += ["", "```yaml", _yaml({dataset: source}), "```"]
    lines.append("")

    lines += ["## Training", ""]
    found = _run_params(inp.params, run)
    lines.append(f"{rec.get('steps', NA)} steps (best dev at step {rec.get('best_step', NA)})"
                 + (f", initialised from `{rec['init']}`" if rec.get("init") else "") + ".")
    if found:
        section, entry = found
        lines += ["", f"Its params (`{section}.runs.{run}` in params.yaml):", "", "```yaml", _yaml({run: entry}),
                  "```"]
        init = entry.get("init") if isinstance(entry, dict) else None
        init_found = _run_params(inp.params, init) if init else None
        if init_found:
            lines += ["", f"The run it was initialised from (`{init_found[0]}.runs.{init}`):", "", "```yaml",
                      _yaml({init: init_found[1]}), "```"]
    else:
        lines += ["", f"(The run `{run}` is not in the params.yaml it was exported with.)"]
    teacher_cfg = ((inp.params.get("teacher_finetune") or {}).get("tasks") or {}).get(teacher["name"])
    base = (inp.params.get("teacher_import") or {}).get("models")
    if teacher_cfg or base:
        lines += ["", f"The teacher `{teacher['name']}`: imported from "
                  f"{', '.join(f'`{v}` ({k})' for k, v in (base or {}).items()) or NA}"
                  + (", fine-tuned with:" if teacher_cfg else "."), ""]
        if teacher_cfg:
            lines += ["```yaml", _yaml({teacher["name"]: teacher_cfg}), "```", ""]
    lines.append("")

    onnx = c.get("onnx")
    lines += ["## Use it", "", "With distillpipe installed (and its `onnx` extra for ONNX Runtime):", "", "```bash",
              f"distillpipe predict {inp.folder} --text {_example(c)}",
              f"distillpipe predict {inp.folder} --input rows.tsv --out predictions.jsonl"
              + (" --runtime onnx" if onnx else ""), "```", "",
              "Each input row gives one JSON line (`distillpipe predict --help`; the repository's README, \"Use your "
              "student\"). To publish the folder: `huggingface_hub.upload_folder(folder_path=..., repo_id=...)`.", ""]
    if onnx:
        lines += [f"`model.onnx` (opset {onnx['opset']}): inputs {', '.join(f'`{n}`' for n in onnx['inputs'])} "
                  f"(int64, batch x length, right-padded), outputs {', '.join(f'`{n}`' for n in onnx['outputs'])}; "
                  + (f"lengths must be multiples of {onnx['length_multiple']} (pad with attention_mask 0), "
                     if onnx["length_multiple"] > 1 else "")
                  + f"at most {onnx['max_length']} tokens. It reproduces the PyTorch model within "
                  f"{onnx['parity_max_difference']:.1e} on padded batches (checked at export).", ""]

    lines += card_lines(c, inp.folder)  # transformers, trust_remote_code (ship/remote_code.py)

    lines += ["## Provenance", "",
              f"- pipeline commit: {inp.commit}",
              f"- distillpipe {c['distillpipe_version']}; weights sha256 `{c['weights']['sha256']}`",
              f"- run `{run}`, dataset `{dataset}`, tokens fingerprint `{str(rec.get('tokens_fingerprint'))[:16]}`",
              f"- training code fingerprint `{rec.get('code') or 'not recorded'}` (by meaning: its checkpoints' "
              "code identity, over the files of the pipeline's `fingerprints/` for its training stage and "
              "architecture)", ""]
    return "\n".join(lines)


def _dataset_source(params: Mapping[str, Any], dataset: str) -> Any:
    prep = params.get("prepare") or {}
    return (prep.get("datasets") or {}).get(dataset) or (prep.get("local") or {}).get(dataset)


def _example(c: Mapping[str, Any]) -> str:
    if c["task_type"] == "qa":
        return "$'Who wrote it?\\tIt was written by ...'"  # bash: \t is a TAB inside $'...'
    return "$'a sentence\\tanother sentence'" if c["text_pair"] else "'a sentence to classify'"
