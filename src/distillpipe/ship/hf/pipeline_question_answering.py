"""``pipeline("question-answering", model=DIR, trust_remote_code=True)`` for an exported distillpipe QA student.

transformers 5 removed its own question-answering pipeline; this one reads the exported student as distillpipe
predicts with it (torch and transformers only): the question cut to ``qa.max_query_len`` tokens, windows of
``max_length`` tokens over the context sharing ``qa.doc_stride`` tokens, the best span over all windows by
start + end logit (the 20 best starts and ends of each window, inside the context, at most 30 tokens), and
SQuAD v2's rule for no answer: the null score (min over windows of the [CLS] start + end logits) minus the best
span's, above the threshold tuned on dev (``qa.threshold``), answers "".

    qa = pipeline("question-answering", model=DIR, trust_remote_code=True)
    qa(question="Who founded it?", context="It was founded by ...")
    -> {"answer": ..., "has_answer": ..., "best_span": ..., "start": ..., "end": ..., "no_answer_score": ...,
        "threshold": ...}
"""

import numpy as np
from transformers import Pipeline

N_BEST = 20
MAX_ANSWER_LEN = 30


class StudentQuestionAnsweringPipeline(Pipeline):
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def __call__(self, question=None, context=None, **kwargs):
        inputs = question if isinstance(question, (dict, list)) else {"question": question, "context": context}
        return super().__call__(inputs, **kwargs)

    def _sanitize_parameters(self, **kwargs):
        return {}, {}, {}

    def preprocess(self, inputs):
        qa, tok = self.model.config.qa, self.tokenizer
        question, context = inputs["question"], inputs["context"]
        enc = tok(question, add_special_tokens=False, return_offsets_mapping=True)
        if len(enc["input_ids"]) > qa["max_query_len"]:  # cut after the last kept token, as training did
            question = question[:enc["offset_mapping"][qa["max_query_len"] - 1][1]]
        windows = tok(question, context, truncation="only_second", max_length=self.model.config.task["max_seq_len"],
                      stride=qa["doc_stride"], return_overflowing_tokens=True, return_offsets_mapping=True,
                      return_token_type_ids=True, padding=True, return_tensors="pt")
        offsets = windows.pop("offset_mapping").numpy()  # (W, L, 2)
        for w in range(offsets.shape[0]):  # (-1, -1) outside the context
            offsets[w][np.asarray([s != 1 for s in windows.sequence_ids(w)])] = -1
        windows.pop("overflow_to_sample_mapping", None)
        return {"model_inputs": dict(windows), "offsets": offsets, "context": context}

    def _forward(self, inputs):
        out = self.model(**inputs["model_inputs"])
        lengths = inputs["model_inputs"]["attention_mask"].sum(1)
        return {"start": out.start_logits, "end": out.end_logits, "lengths": lengths, "offsets": inputs["offsets"],
                "context": inputs["context"]}

    def postprocess(self, out):
        context, threshold = out["context"], self.model.config.qa["threshold"]
        best, span, null = -np.inf, (0, 0), np.inf
        for w, n in enumerate(out["lengths"].tolist()):
            s = out["start"][w, :n].double().cpu().numpy()
            e = out["end"][w, :n].double().cpu().numpy()
            offsets = out["offsets"][w, :n]
            null = min(null, s[0] + e[0])
            in_ctx = offsets[:, 0] >= 0
            top_s = [i for i in np.argsort(-s)[:N_BEST] if in_ctx[i]]
            top_e = [j for j in np.argsort(-e)[:N_BEST] if in_ctx[j]]
            for i in top_s:
                for j in top_e:
                    if i <= j < i + MAX_ANSWER_LEN and s[i] + e[j] > best:
                        best, span = s[i] + e[j], (int(offsets[i, 0]), int(offsets[j, 1]))
        margin = float(null - best) if np.isfinite(best) else float("inf")
        text = context[span[0]:span[1]]
        answer = "" if margin > threshold else text
        return {"answer": answer, "has_answer": bool(answer), "best_span": text, "start": span[0], "end": span[1],
                "no_answer_score": margin, "threshold": threshold}
