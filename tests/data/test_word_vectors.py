"""Word-vector tables (stage word_vectors): the same bytes from two separate processes, and each token's row is
the FastText vector of its string (``##`` stripped; special tokens zero)."""

import os
import subprocess
import sys

import numpy as np
import pytest
from _tiny import SPECIAL, write_params

from distillpipe.config.base import build
from distillpipe.config.word_vectors import TrainedVectorsConfig
from distillpipe.data.fasttext import corpus_words, make_word_vectors, train_fasttext
from distillpipe.data.word_vectors import WordVectorsError, load_table

WORDS = ["the", "cat", "cats", "sat", "walk", "dog", "on", "mat", "##s", "##ing", "##ed"]
TEXTS = ["The cats sat on the mat.", "A dog walked; the cat is walking.", "Dogs walk, cats sit."] * 20
CFG = {"corpus": "toy", "dim": 8, "epochs": 2, "window": 3, "min_count": 1, "min_n": 2, "max_n": 4, "seed": 3,
       "center": False}


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    from datasets import Dataset, DatasetDict
    from transformers import BertTokenizerFast

    root = tmp_path_factory.mktemp("wv")
    tok_dir = root / "tok"
    tok_dir.mkdir()
    (tok_dir / "vocab.txt").write_text("\n".join(SPECIAL + WORDS) + "\n")
    BertTokenizerFast(vocab=str(tok_dir / "vocab.txt"), do_lower_case=True).save_pretrained(tok_dir)
    DatasetDict({"train": Dataset.from_dict({"text": TEXTS})}).save_to_disk(str(root / "corpus"))
    params = write_params(root / "params.yaml", {
        "tokenize": {"tokenizer": str(tok_dir), "max_seq_len": 32, "datasets": {}},
        "word_vectors": {"tables": {"ft": CFG}, "local": {}}})
    return {"root": root, "tok": tok_dir, "params": params}


def _stage(toy, out, hash_seed):
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "distillpipe.cli", "word-vectors", "--name", "ft", "--corpus",
           str(toy["root"] / "corpus"), "--out", str(out), "--params", str(toy["params"])]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    return out


def test_two_processes_write_the_same_bytes_and_rows_are_fasttext_vectors(toy):
    from transformers import AutoTokenizer

    # this process (its own random str hashing) and a separate one with another PYTHONHASHSEED
    a = toy["root"] / "a"
    make_word_vectors("ft", build(TrainedVectorsConfig, CFG, "cfg"), str(toy["tok"]), a, toy["root"] / "corpus")
    b = _stage(toy, toy["root"] / "b", hash_seed=12345)
    for f in ("vectors.npy", "meta.json"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    tok = AutoTokenizer.from_pretrained(toy["tok"])
    kv = train_fasttext(corpus_words(tok, TEXTS), build(TrainedVectorsConfig, CFG, "cfg"))  # in this process
    table = np.load(a / "vectors.npy")
    vocab = tok.get_vocab()
    assert table.shape == (len(SPECIAL) + len(WORDS), 8)
    for piece, i in vocab.items():
        if piece in SPECIAL:
            assert not table[i].any(), piece
        else:
            word = piece[2:] if piece.startswith("##") else piece
            np.testing.assert_array_equal(table[i], kv[word], err_msg=piece)
    assert "cats" in kv.key_to_index and "walking" in kv.key_to_index  # words, split like the tokenizer does
    centred = toy["root"] / "centred"
    make_word_vectors("ft", build(TrainedVectorsConfig, {**CFG, "center": True}, "cfg"), str(toy["tok"]), centred,
                      toy["root"] / "corpus")
    real = table.any(axis=1)
    np.testing.assert_allclose(np.load(centred / "vectors.npy")[real], table[real] - table[real].mean(0), atol=1e-6)
    assert not np.load(centred / "vectors.npy")[~real].any()


def test_a_table_of_another_tokenizer_or_with_changed_bytes_is_refused(toy):
    import json

    from distillpipe.assets import tokenizer_sha256

    folder = toy["root"] / "c"
    make_word_vectors("ft", build(TrainedVectorsConfig, CFG, "cfg"), str(toy["tok"]), folder, toy["root"] / "corpus")
    table, digest = load_table(folder, tokenizer_sha256=tokenizer_sha256(toy["tok"]))
    assert digest == json.loads((folder / "meta.json").read_text())["fingerprint"]
    with pytest.raises(WordVectorsError, match="another tokenizer"):
        load_table(folder, tokenizer_sha256="0" * 64)
    bad = toy["root"] / "bad"
    bad.mkdir()
    (bad / "meta.json").write_text((folder / "meta.json").read_text())
    np.save(bad / "vectors.npy", table.numpy() + 1)
    with pytest.raises(WordVectorsError, match="fingerprint"):
        load_table(bad, tokenizer_sha256=tokenizer_sha256(toy["tok"]))
