"""Run in a child interpreter where distillpipe cannot be imported (tests/ship/test_ship_transformers.py): load
exported folders with transformers alone and write what it predicts. argv: a JSON file of jobs, the output file.

A job: {"folder", "kind": "classification" | "pair" | "diffcat" | "qa", "rows": [[field, ...], ...]}. For each row:
the token ids fed, the model's logits (AutoModelFor...), and the pipeline's output (classification: every label's
score; QA: the answer record)."""

import importlib.abc
import json
import sys


class _Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "distillpipe" or name.startswith("distillpipe."):
            raise ImportError(f"{name} is blocked in this process: the exported folder must load without it")
        return None


sys.meta_path.insert(0, _Blocked())
sys.path = [p for p in sys.path if not p.rstrip("/").endswith("/src")]
try:
    import distillpipe  # noqa: F401
    blocked = False
except ImportError:
    blocked = True

import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    pipeline,
)


def run(job):
    folder, kind, rows = job["folder"], job["kind"], job["rows"]
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    auto = AutoModelForQuestionAnswering if kind == "qa" else AutoModelForSequenceClassification
    model, info = auto.from_pretrained(folder, trust_remote_code=True, output_loading_info=True)
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    out = {"config_class": type(config).__name__, "model_class": type(model).__name__,
           "model_module": type(model).__module__, "loading_info": {k: sorted(map(str, v)) for k, v in info.items()},
           "tokenizer_class": type(tok).__name__, "rows": []}
    cut = {"truncation": True, "max_length": config.task["max_seq_len"]}
    with torch.inference_mode():
        if kind == "qa":
            qa = pipeline("question-answering", model=folder, trust_remote_code=True)
            for q, c in rows:
                enc = tok(q, c, truncation="only_second", max_length=config.task["max_seq_len"], return_tensors="pt")
                o = model(**enc)
                out["rows"].append({"input_ids": enc["input_ids"][0].tolist(),
                                    "token_type_ids": enc["token_type_ids"][0].tolist(),
                                    "start": o.start_logits[0].tolist(), "end": o.end_logits[0].tolist(),
                                    "pipeline": qa(question=q, context=c)})
            return out
        if kind == "diffcat":
            for a, b in rows:
                ea, eb = tok(a, return_tensors="pt", **cut), tok(b, return_tensors="pt", **cut)
                logits = model(a_input_ids=ea["input_ids"], a_attention_mask=ea["attention_mask"],
                               b_input_ids=eb["input_ids"], b_attention_mask=eb["attention_mask"]).logits
                out["rows"].append({"a_input_ids": ea["input_ids"][0].tolist(),
                                    "b_input_ids": eb["input_ids"][0].tolist(), "logits": logits[0].tolist()})
            try:
                pipeline("text-classification", model=folder, trust_remote_code=True)({"text": rows[0][0],
                                                                                    "text_pair": rows[0][1]})
                out["pipeline_error"] = None
            except ValueError as e:
                out["pipeline_error"] = str(e)
            return out
        clf = pipeline("text-classification", model=folder, trust_remote_code=True, top_k=None)
        for fields in rows:
            enc = tok(*fields, return_tensors="pt", **cut)
            o = model(**enc)
            inputs = fields[0] if len(fields) == 1 else {"text": fields[0], "text_pair": fields[1]}
            out["rows"].append({"input_ids": enc["input_ids"][0].tolist(),
                                "token_type_ids": enc["token_type_ids"][0].tolist(),
                                "logits": o.logits[0].tolist(), "pipeline": clf(inputs, **cut)})
    return out


if __name__ == "__main__":
    jobs = json.loads(open(sys.argv[1]).read())
    result = {"distillpipe_blocked": blocked, "distillpipe_in_modules": "distillpipe" in sys.modules,
              "jobs": [run(j) for j in jobs]}
    open(sys.argv[2], "w").write(json.dumps(result))
