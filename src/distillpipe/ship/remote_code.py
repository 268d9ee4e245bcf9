"""The exported folder as a ``transformers`` model: the code files (``configuration_<key>.py``, ``modeling_<key>.py``,
the shared heads and, for QA, the pipeline) and the ``config.json`` entries (``model_type``, ``auto_map``,
``id2label``, ``custom_pipelines``) that let ``AutoConfig``, ``AutoModelForSequenceClassification`` /
``AutoModelForQuestionAnswering`` and ``pipeline("text-classification" | "question-answering")`` load it with
``trust_remote_code=True``, with torch and transformers only (no distillpipe).

The code files are templates in ``ship/hf/``, copied as they are (never imported by distillpipe): self-contained
re-implementations of the students' inference forwards with distillpipe's parameter names, so ``model.safetensors``
loads unchanged. Their outputs equal ``distillpipe predict``'s (tests/ship/test_ship_transformers.py).

Every architecture ships code. ELMo-C, ELMo-A and ELMo-Sub classification students share one model class: the
three differ only in the language model's output layer (continuous, adaptive softmax, full softmax; ELMo-C paper
Table 1), which a fine-tuned student does not keep (students/elmo.py builds it for language modelling only, and a
fine-tune copies everything but it). What does not fit transformers' interfaces, and why (:func:`limits`): a
DiffCat pair student encodes its two sentences separately (CMOW paper sec. III-C), while the text-classification
pipeline (and every tokenizer call made for a pair) builds one joint sequence ``[CLS] a [SEP] b [SEP]``: the model
loads and its forward takes the two encodings (``a_input_ids``, ``a_attention_mask``, ``b_input_ids``,
``b_attention_mask``), but the pipeline is refused. transformers 5 removed its own question-answering pipeline;
a WaLDORf QA folder ships its own (``pipeline_question_answering.py``: the pipeline's windows, best span and
dev-tuned no-answer threshold).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).parent / "hf"
HEADS_FILE = "student_heads.py"
QA_PIPELINE_FILE = "pipeline_question_answering.py"
CLASS_NAMES = {"cmow_hybrid": "CMOWHybrid", "waldorf": "WaLDORf", "minialbert": "MiniALBERT", "elmo": "Elmo"}
"""Architecture key (``distillpipe.students.STUDENTS``) -> the prefix of its classes in the modeling file
(``<name>Config``, ``<name>For...``). Every architecture has one (tests/ship/test_ship_transformers.py)."""

DIFFCAT_REASON = (
    "a DiffCat student encodes the two sentences of a pair separately and classifies [a, |a-b|, b] (CMOW paper "
    "sec. III-C), but transformers' text-classification pipeline encodes a pair as one joint sequence "
    "([CLS] a [SEP] b [SEP]), so it cannot feed this model; AutoModelForSequenceClassification loads it, and its "
    "forward takes each sentence tokenized on its own (a_input_ids, a_attention_mask, b_input_ids, "
    "b_attention_mask)")


def _class_name(student: str) -> str:
    if student not in CLASS_NAMES:
        raise ValueError(f"no transformers code for the student {student!r}: add ship/hf/configuration_{student}.py "
                         f"and modeling_{student}.py and register it in remote_code.CLASS_NAMES")
    return CLASS_NAMES[student]


def files(student: str, kind: str) -> list[str]:
    """The code files an exported student of this architecture and task kind ships."""
    _class_name(student)
    names = [f"configuration_{student}.py", f"modeling_{student}.py", HEADS_FILE]
    return names + ([QA_PIPELINE_FILE] if kind == "qa" else [])


def limits(config: dict[str, Any]) -> str | None:
    """What of transformers' interface this exported student cannot serve, and why; None when all of it."""
    if config["task"]["encoding"] == "diffcat":
        return DIFFCAT_REASON
    return None


def config_entries(config: dict[str, Any]) -> dict[str, Any]:
    """The keys transformers reads, for an exported student's ``config.json``."""
    key, kind = config["student"], config["task"]["kind"]
    name = _class_name(key)
    auto = "AutoModelForQuestionAnswering" if kind == "qa" else "AutoModelForSequenceClassification"
    model_class = f"{name}ForQuestionAnswering" if kind == "qa" else f"{name}ForSequenceClassification"
    out: dict[str, Any] = {
        "model_type": f"distillpipe_{key}",
        "architectures": [model_class],
        "auto_map": {"AutoConfig": f"configuration_{key}.{name}Config", auto: f"modeling_{key}.{model_class}"},
    }
    if kind == "classification":
        bin_width = config["task"]["bin_width"]
        n = config["task"]["num_labels"]
        labels = ([f"{k * bin_width:g}" for k in range(n)] if bin_width is not None  # a bin by its value
                  else config["label_names"] or [str(k) for k in range(n)])
        out["id2label"] = {str(k): v for k, v in enumerate(labels)}
        out["label2id"] = {v: k for k, v in enumerate(labels)}
    else:
        out["custom_pipelines"] = {"question-answering": {
            "impl": f"{QA_PIPELINE_FILE[:-3]}.StudentQuestionAnsweringPipeline", "pt": [auto]}}
    return out


def write_code(folder: Path, config: dict[str, Any]) -> list[str]:
    """Copy the code files into ``folder``; their names."""
    names = files(config["student"], config["task"]["kind"])
    for name in names:
        shutil.copyfile(TEMPLATES / name, folder / name)
    return names


def card_lines(config: dict[str, Any], folder: str) -> list[str]:
    """The model card's "With transformers" part: how to load the folder without distillpipe, or why it cannot."""
    out = ["### With transformers (no distillpipe)", ""]
    n, kind = config["task"]["max_seq_len"], config["task"]["kind"]
    out += ["The folder holds its own model code (" + ", ".join(f"`{f}`" for f in files(config["student"], kind))
            + "; torch and transformers only), so it loads with `trust_remote_code=True` (read the code first):", "",
            "```python", "from transformers import AutoTokenizer, pipeline"]
    if kind == "qa":
        out += ["from transformers import AutoModelForQuestionAnswering", "",
                f'model = AutoModelForQuestionAnswering.from_pretrained("{folder}", trust_remote_code=True)',
                f'qa = pipeline("question-answering", model="{folder}", trust_remote_code=True)',
                'qa(question="Who wrote it?", context="It was written by ...")', "```", "",
                "The pipeline is the folder's own (`pipeline_question_answering.py`; transformers 5 has none): the "
                "windows, best span and no-answer threshold of `distillpipe predict`, and the same record.", ""]
        return out
    out += ["from transformers import AutoModelForSequenceClassification", "",
            f'model = AutoModelForSequenceClassification.from_pretrained("{folder}", trust_remote_code=True)',
            f'tokenizer = AutoTokenizer.from_pretrained("{folder}", trust_remote_code=True)']
    if config["task"]["encoding"] == "diffcat":
        return out + ["```", "", f"No pipeline: {DIFFCAT_REASON}.", ""]
    text = '{"text": "a sentence", "text_pair": "another sentence"}' if config["text_pair"] else '"a sentence"'
    out += [f'clf = pipeline("text-classification", model="{folder}", trust_remote_code=True)',
            f"clf({text}, truncation=True, max_length={n}, top_k=None)", "```", "",
            f"Truncate to {n} tokens, as training did (longer rows are refused)."]
    if config["task"]["bin_width"] is not None:
        out += ["The labels are the score bins, named by their value: the score `distillpipe predict` gives is the "
                "expected value, sum(probability x value) over the bins."]
    return out + [""]
