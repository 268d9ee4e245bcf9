"""Tiny SQuAD-v2-format QA sets, corpora and question-generation params for the qg tests, written to tmp_path."""

from __future__ import annotations

import random
from pathlib import Path

WORDS = ["river", "castle", "forest", "engine", "garden", "market", "bridge", "tower", "valley", "harbor",
         "temple", "island", "desert", "palace", "meadow", "canyon", "glacier", "village", "station", "library"]
NAMES = ["Alma", "Boris", "Clara", "Dmitri", "Elena", "Felix", "Greta", "Hugo"]


def sentence(rng: random.Random) -> str:
    """'Clara built the river near the tower.' style sentences (a name, a verb, two nouns)."""
    verb = rng.choice(["built", "found", "painted", "sold", "visited", "crossed"])
    return f"{rng.choice(NAMES)} {verb} the {rng.choice(WORDS)} near the {rng.choice(WORDS)}."


def paragraph(rng: random.Random, n: int = 3) -> str:
    return " ".join(sentence(rng) for _ in range(n))


def qa_rows(split: str, n: int, rng: random.Random, unanswerable_every: int = 4) -> list[dict]:
    """Cloze questions: the first sentence with its name replaced by 'Who'; every k-th row unanswerable."""
    rows = []
    for i in range(n):
        context = paragraph(rng)
        first = context.split(". ")[0]
        name = first.split()[0]
        question = "Who" + first[len(name):].rstrip(".") + "?"
        answers = {"text": [name], "answer_start": [0]}
        if unanswerable_every and i % unanswerable_every == unanswerable_every - 1:
            answers = {"text": [], "answer_start": []}
        rows.append({"id": f"{split}-{i}", "title": f"{split}-article-{i % 5}", "context": context,
                     "question": question, "answers": answers})
    return rows


def write_qa(path: Path, n_train: int = 96, n_dev: int = 24, n_test: int = 12, seed: int = 0) -> Path:
    from datasets import DatasetDict

    from distillpipe.data.features import rows_to_dataset
    from distillpipe.data.schema import write_meta

    rng = random.Random(seed)
    fields = ["question", "context"]
    dd = DatasetDict({s: rows_to_dataset(qa_rows(s, n, rng), "qa", fields)
                      for s, n in (("train", n_train), ("dev", n_dev), ("test", n_test))})
    dd.save_to_disk(str(path))
    write_meta(path, {"name": "toy_qa", "task_type": "qa", "num_labels": 0, "label_names": [], "text_fields": fields,
                      "source": {}, "summary": {}})
    return path


def write_corpus(path: Path, rows: list[dict], dev: list[dict] | None = None) -> Path:
    """A prepared corpus (doc_id, text) with a train split (and a dev split of ``dev`` rows)."""
    from datasets import DatasetDict

    from distillpipe.data.features import rows_to_dataset
    from distillpipe.data.schema import write_meta

    splits = {"train": rows_to_dataset(rows, "corpus", ["text"])}
    if dev:
        splits["dev"] = rows_to_dataset(dev, "corpus", ["text"])
    DatasetDict(splits).save_to_disk(str(path))
    write_meta(path, {"name": "toy_corpus", "task_type": "corpus", "num_labels": 0, "label_names": [],
                      "text_fields": ["text"], "source": {}, "summary": {}})
    return path


def fresh_paragraphs(n: int, seed: int = 100) -> list[dict]:
    rng = random.Random(seed)
    return [{"doc_id": f"new-article-{i // 3}", "text": paragraph(rng)} for i in range(n)]


def scratch_model(**over) -> dict:
    m = {"source": "scratch", "vocab_size": 64, "character_coverage": 1.0, "d_model": 32, "d_kv": 8, "d_ff": 64,
         "n_encoder_layers": 1, "n_decoder_layers": 1, "n_heads": 4, "relative_attention_num_buckets": 8,
         "relative_attention_max_distance": 32, "feed_forward_proj": "relu", "dropout": 0.0}
    m.update(over)
    return m


def qg_params(**over) -> dict:
    p = {"device": "cpu", "model": scratch_model(), "answer_hint": False, "max_source_len": 48, "max_target_len": 16,
         "epochs": 1, "batch_size": 16, "lr": 1e-2, "weight_decay": 0.0, "warmup_fraction": 0.0,
         "max_grad_norm": 1.0, "max_train_rows": None, "checkpoint_minutes": 10, "samples": 2, "seed": 0}
    p.update(over)
    return p


def augment_params(**over) -> dict:
    p = {"device": "cpu", "static_kv_cache": True, "cpu_threads": 1, "exclude_article_splits": ["dev", "test"],
         "min_paragraph_chars": 20,
         "max_paragraphs": None, "n_per_paragraph": 2,
         "decoding": {"kind": "sample", "temperature": 1.0, "top_k": 0, "top_p": 1.0},
         "max_source_len": 48, "max_new_tokens": 12, "no_repeat_ngram_size": 0, "batch_size": 4,
         "chunk_paragraphs": 4, "filters": {"min_question_words": 1, "drop_context_copies": True, "dedupe": "off"},
         "seed": 0}
    p.update(over)
    return p
