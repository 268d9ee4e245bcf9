"""Which paragraphs the ``augment`` stage generates questions for (WaLDORf sec. 3.4: Wikipedia paragraphs found in
no SQuAD article or paragraph).

They come from the train split of a prepared corpus (``doc_id``, ``text``: its dev/test articles are held out like
any task's); those of articles in the QA set's ``exclude_article_splits`` (title = doc_id) and those that are a QA
context are left out, the rest filtered by length, deduplicated and capped by a seeded sample.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from distillpipe.config.augment import AugmentConfig
from distillpipe.data import schema
from distillpipe.qg import QgError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Paragraph:
    doc_id: str
    text: str


def select_paragraphs(corpus_dir: Path, exclude_dir: Path | None,
                      cfg: AugmentConfig) -> tuple[list[Paragraph], dict[str, int]]:
    """The corpus paragraphs to generate questions for, in corpus order, and the counts of those left out."""
    from datasets import load_from_disk

    meta = schema.read_meta(corpus_dir)
    if meta.get("task_type") != "corpus":
        raise QgError(f"{corpus_dir} holds a {meta.get('task_type')!r} dataset; augment reads paragraphs from a "
                      "corpus (doc_id, text), e.g. data/prepared/wiki")
    titles: set[str] = set()
    contexts: set[str] = set()
    if exclude_dir is not None:
        qmeta = schema.read_meta(exclude_dir)
        if qmeta.get("task_type") != "qa":
            raise QgError(f"--exclude {exclude_dir} holds a {qmeta.get('task_type')!r} dataset, not a QA set")
        qa = load_from_disk(str(exclude_dir))
        missing = [s for s in cfg.exclude_article_splits if s not in qa]
        if missing:
            raise QgError(f"augment.exclude_article_splits names split(s) {missing} that {exclude_dir} does not have "
                          f"(it has {list(qa)})")
        for s in cfg.exclude_article_splits:
            titles.update(qa[s]["title"])
        for s in qa:
            contexts.update(c.strip() for c in qa[s]["context"])
    elif cfg.exclude_article_splits:
        log.warning("augment: no QA set given (--exclude), so no article or context is left out")
    corpus = load_from_disk(str(corpus_dir))
    if "train" not in corpus:
        raise QgError(f"{corpus_dir} has no train split (it has {list(corpus)}): augment reads the corpus's train "
                      "paragraphs only")
    left_out: Counter[str] = Counter()
    for split in corpus:
        if split != "train":
            left_out[f"paragraphs of the corpus's {split} split"] += len(corpus[split])
    seen: set[str] = set()
    out: list[Paragraph] = []
    train = corpus["train"]
    for doc_id, text in zip(train["doc_id"], train["text"]):
        text = text.strip()
        if doc_id in titles:
            left_out["paragraphs of excluded articles"] += 1
        elif text in contexts:
            left_out["QA contexts"] += 1
        elif len(text) < cfg.min_paragraph_chars:
            left_out["short paragraphs"] += 1
        elif text in seen:
            left_out["duplicate paragraphs"] += 1
        else:
            seen.add(text)
            out.append(Paragraph(doc_id, text))
    if cfg.max_paragraphs is not None and len(out) > cfg.max_paragraphs:
        left_out["over max_paragraphs"] = len(out) - cfg.max_paragraphs
        keep = sorted(random.Random(cfg.seed).sample(range(len(out)), cfg.max_paragraphs))
        out = [out[i] for i in keep]
    if not out:
        raise QgError(f"augment: no paragraph of {corpus_dir} is left to generate questions for (left out: "
                      f"{dict(left_out)}); lower augment.min_paragraph_chars or use another corpus")
    return out, dict(sorted(left_out.items()))
