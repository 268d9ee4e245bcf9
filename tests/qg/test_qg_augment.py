"""augment: which paragraphs are used, the unlabeled prepared-QA output, resume after a crash or a SIGKILL
(same rows as an uninterrupted run, no duplicates), stale chunks, and the labeled flag through tokenize."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml
from _qg_tiny import augment_params, fresh_paragraphs, write_corpus
from _tiny import invoke_cli

from distillpipe.config.augment import AugmentConfig
from distillpipe.config.base import build
from distillpipe.identity import sha256_dir
from distillpipe.qg import QgError
from distillpipe.qg.augment import augment
from distillpipe.qg.paragraphs import select_paragraphs


def _cfg(**over):
    return build(AugmentConfig, augment_params(**over), "augment")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, toy_qa):
    """12 usable paragraphs, plus one of each kind that must be left out."""
    from datasets import load_from_disk

    qa = load_from_disk(str(toy_qa))
    fresh = fresh_paragraphs(12)
    rows = (fresh[:6]
            + [{"doc_id": "dev-article-1", "text": fresh_paragraphs(1, seed=1)[0]["text"]},    # a dev article
               {"doc_id": "test-article-0", "text": fresh_paragraphs(1, seed=2)[0]["text"]},   # a test article
               {"doc_id": "new-article-9", "text": qa["train"][3]["context"]},                 # a QA context
               {"doc_id": "new-article-9", "text": "Too short."},
               dict(fresh[0])]                                                                   # a duplicate
            + [{"doc_id": "train-article-2", "text": t["text"]} for t in fresh[6:]])            # train articles: used
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus", rows), fresh


def test_select_paragraphs(corpus, toy_qa):
    path, fresh = corpus
    paragraphs, left_out = select_paragraphs(path, toy_qa, _cfg())
    assert [p.text for p in paragraphs] == [f["text"] for f in fresh]
    assert left_out == {"QA contexts": 1, "duplicate paragraphs": 1, "paragraphs of excluded articles": 2,
                        "short paragraphs": 1}
    capped, left = select_paragraphs(path, toy_qa, _cfg(max_paragraphs=5, seed=3))
    assert len(capped) == 5 and left["over max_paragraphs"] == 7
    positions = [[p.text for p in paragraphs].index(c.text) for c in capped]
    assert positions == sorted(positions), "a capped sample keeps corpus order"
    assert capped == select_paragraphs(path, toy_qa, _cfg(max_paragraphs=5, seed=3))[0]
    assert capped != select_paragraphs(path, toy_qa, _cfg(max_paragraphs=5, seed=4))[0]
    with pytest.raises(QgError, match=r"exclude_article_splits names split\(s\) \['val'\]"):
        select_paragraphs(path, toy_qa, _cfg(exclude_article_splits=["val"]))
    with pytest.raises(QgError, match="augment reads paragraphs from a corpus"):
        select_paragraphs(toy_qa, None, _cfg())


def test_only_the_corpus_train_split_is_read(tmp_path):
    """The corpus's dev/test articles are held out like a task's (one article partition, prepare.wiki_articles)."""
    fresh = fresh_paragraphs(8)
    path = write_corpus(tmp_path / "corpus", fresh[:5], dev=fresh[5:])
    paragraphs, left_out = select_paragraphs(path, None, _cfg())
    assert [p.text for p in paragraphs] == [f["text"] for f in fresh[:5]]
    assert left_out == {"paragraphs of the corpus's dev split": 3}


def _rows(out):
    from datasets import load_from_disk

    return load_from_disk(str(out))["train"].to_list()


def _files(out):
    return ({p.name: p.read_bytes() for p in sorted(out.iterdir())
             if p.suffix in (".arrow", ".json") and p.name != "state.json"}
            | {f"train/{p.name}": p.read_bytes() for p in sorted((out / "train").glob("*.arrow"))})


@pytest.fixture(scope="module")
def reference(tmp_path_factory, corpus, toy_qa, tiny_qg):
    root = tmp_path_factory.mktemp("ref")
    s = augment("toy_aug", corpus[0], toy_qa, tiny_qg, _cfg(), root / "out", root / "chunks")
    return root / "out", s


def test_output_is_an_unlabeled_prepared_qa_set(reference, corpus, tiny_qg):
    out, s = reference
    rows = _rows(out)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["task_type"] == "qa" and meta["labeled"] is False and meta["text_fields"] == ["question", "context"]
    assert meta["source"]["generator"]["sha256"] == sha256_dir(tiny_qg)
    assert meta["source"]["augment"]["n_per_paragraph"] == 2
    assert all(r["answers"] == {"text": [], "answer_start": []} for r in rows)
    assert len({r["id"] for r in rows}) == len(rows) == s.kept
    assert s.paragraphs == 12 and s.generated == 24 and s.kept + sum(s.dropped.values()) == 24
    fresh = {f["text"]: f["doc_id"] for f in corpus[1]}
    assert all(fresh[r["context"]] == r["title"] or r["title"] == "train-article-2" for r in rows)
    assert not (out.parent / "chunks").exists(), "the chunk folder is cleared on success"
    from datasets import load_from_disk

    assert list(load_from_disk(str(out))) == ["train"]


def test_crash_then_resume_gives_the_same_dataset(reference, corpus, toy_qa, tiny_qg, tmp_path, monkeypatch, caplog):
    import distillpipe.qg.augment as aug

    real, calls = aug.generate_questions, []

    def crash_on_third_chunk(*a, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # stands in for a kill between chunks
        return real(*a, **kw)

    monkeypatch.setattr(aug, "generate_questions", crash_on_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        augment("toy_aug", corpus[0], toy_qa, tiny_qg, _cfg(), tmp_path / "out", tmp_path / "chunks")
    monkeypatch.setattr(aug, "generate_questions", real)
    assert not (tmp_path / "out").exists()
    done = json.loads((tmp_path / "chunks" / "done.json").read_text())
    assert sorted(done) == ["0", "1"]
    (tmp_path / "chunks" / "chunk-000001.json").write_text('{"chunk": 1, "questions": [], "truncated": 0}\n')  # damaged
    s = augment("toy_aug", corpus[0], toy_qa, tiny_qg, _cfg(), tmp_path / "out", tmp_path / "chunks")
    assert s.resumed_chunks == 1 and "chunk 1 in" in caplog.text and "missing or damaged" in caplog.text
    assert _rows(tmp_path / "out") == _rows(reference[0])
    assert _files(tmp_path / "out") == _files(reference[0])


def test_chunks_of_other_params_are_discarded(reference, corpus, toy_qa, tiny_qg, tmp_path, caplog):
    other = _cfg(seed=1)
    chunks = tmp_path / "chunks"
    (chunks).mkdir()
    shutil.copytree(reference[0], tmp_path / "unused")  # any leftover content
    (chunks / "run.json").write_text(json.dumps({"run_id": "another run", "n_chunks": 3}))
    (chunks / "chunk-000000.json").write_text('{"chunk": 0, "questions": [["stale"]], "truncated": 0}')
    augment("toy_aug", corpus[0], toy_qa, tiny_qg, other, tmp_path / "out", chunks)
    assert "starting over" in caplog.text
    assert all("stale" not in r["question"] for r in _rows(tmp_path / "out"))
    assert _rows(tmp_path / "out") != _rows(reference[0])  # another seed, other samples


def test_generator_trained_with_answer_hints_is_refused(corpus, toy_qa, tiny_qg, tmp_path):
    qg = shutil.copytree(tiny_qg, tmp_path / "qg")
    meta = json.loads((qg / "qg.json").read_text())
    (qg / "qg.json").write_text(json.dumps({**meta, "answer_hint": True}))
    with pytest.raises(QgError, match="trained with answer hints"):
        augment("toy_aug", corpus[0], toy_qa, qg, _cfg(), tmp_path / "out", tmp_path / "chunks")


def test_tokenize_copies_the_labeled_flag(reference, toy_qa, tmp_path):
    from _tiny import make_tiny_bert_dir

    from distillpipe.config.tokenize import TokenizeConfig
    from distillpipe.data.tokenize import tokenize_dataset

    bert = make_tiny_bert_dir(tmp_path / "bert")
    qa = {"kind": "qa", "doc_stride": 16, "max_query_len": 16, "max_seq_len": None}
    cfg = build(TokenizeConfig, {"tokenizer": str(bert), "max_seq_len": 64,
                                 "datasets": {"toy_aug": qa, "toy_qa": qa}}, "tokenize")
    tokenize_dataset("toy_aug", reference[0], cfg, tmp_path / "aug_tokens")
    tokenize_dataset("toy_qa", toy_qa, cfg, tmp_path / "qa_tokens")  # a prepare output: no `labeled` key
    assert json.loads((tmp_path / "aug_tokens" / "meta.json").read_text())["labeled"] is False
    assert json.loads((tmp_path / "qa_tokens" / "meta.json").read_text())["labeled"] is True


def _cli(params, corpus, qa, qg, out, chunks):
    return [sys.executable, "-m", "distillpipe.cli", "augment", "--name", "toy_aug", "--corpus", str(corpus),
            "--exclude", str(qa), "--qg", str(qg), "--out", str(out), "--chunks", str(chunks), "--params", str(params)]


@pytest.mark.slow  # ~13 s: a child process killed mid-chunk; test_crash_then_resume_gives_the_same_dataset covers
# resuming in the default suite (a crash between chunks, in process)
def test_sigkill_mid_augment_then_resume_gives_the_same_rows(corpus, toy_qa, tiny_qg, tmp_path):
    # many one-paragraph chunks, so that the run is killed between two of them
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"augment": augment_params(chunk_paragraphs=1, batch_size=1, max_new_tokens=24)}))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # the uninterrupted reference and the resumed run in this process (the same command, no ~5 s of imports); the
    # run to kill in a process of its own
    ref = invoke_cli(_cli(params, corpus[0], toy_qa, tiny_qg, tmp_path / "ref", tmp_path / "ref_chunks")[3:])
    assert ref.returncode == 0, ref.stderr

    chunks = tmp_path / "chunks"
    proc = subprocess.Popen(_cli(params, corpus[0], toy_qa, tiny_qg, tmp_path / "out", chunks), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            if len(json.loads((chunks / "done.json").read_text())) >= 3:
                break
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "out").exists(), "the run finished before it could be killed; make it longer"
    done = len(json.loads((chunks / "done.json").read_text()))
    assert 3 <= done < 12

    res = invoke_cli(_cli(params, corpus[0], toy_qa, tiny_qg, tmp_path / "out", chunks)[3:])
    assert res.returncode == 0, res.stderr
    assert f"resuming, {done} of 12 chunks already done" in res.stderr
    rows, expected = _rows(tmp_path / "out"), _rows(tmp_path / "ref")
    assert len({r["id"] for r in rows}) == len(rows), "no duplicated rows"
    assert rows == expected
    assert _files(tmp_path / "out") == _files(tmp_path / "ref")


@pytest.mark.parametrize("workers", [pytest.param(1, marks=pytest.mark.slow), 2])  # 2 workers cover 1 (budget)
def test_chunks_as_dask_tasks_give_the_same_rows(corpus, toy_qa, tiny_qg, tmp_path, workers):
    """One task per chunk on a LocalCluster of worker processes: the same dataset, byte for byte, as in this
    process, whatever the number of workers and the order the chunks finish in."""
    from distillpipe.scale.machine import load_machine

    pytest.importorskip("distributed")
    path, _ = corpus
    cfg = _cfg(cpu_threads=1)
    augment("aug", path, toy_qa, tiny_qg, cfg, tmp_path / "ref", tmp_path / "ref_chunks")
    empty = tmp_path / "machine.yaml"
    empty.write_text("")
    cluster = load_machine({"DISTILLPIPE_MACHINE": str(empty), "DISTILLPIPE_CLUSTER": "local",
                            "DISTILLPIPE_WORKERS": str(workers)}).cluster
    summary = augment("aug", path, toy_qa, tiny_qg, cfg, tmp_path / "out", tmp_path / "chunks", cluster=cluster)
    assert summary.generated == 24 and summary.chunks == 3
    assert sha256_dir(tmp_path / "out") == sha256_dir(tmp_path / "ref")
