"""The embedded generator's SentencePiece vocabulary: deterministic, round-trips text, and the T5 tokenizer
built on it encodes exactly as SentencePiece does (plus </s>)."""

import random

import sentencepiece as spm
from _qg_tiny import paragraph

from distillpipe.qg.vocab import EOS_ID, PAD_ID, SPM_FILE, UNK_ID, load_spm_tokenizer, train_sentencepiece


def _texts(n=200, seed=0):
    rng = random.Random(seed)
    return [paragraph(rng) for _ in range(n)] + ["Who wrote, \"A petty thief is put in jail.\" in 1857?"]


def test_sentencepiece_is_deterministic_and_round_trips(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    size = train_sentencepiece(_texts(), 120, 1.0, a / SPM_FILE)
    train_sentencepiece(_texts(), 120, 1.0, b / SPM_FILE)
    assert (a / SPM_FILE).read_bytes() == (b / SPM_FILE).read_bytes(), (
        "same texts, same vocabulary (resume relies on it)")
    sp = spm.SentencePieceProcessor(model_file=str(a / SPM_FILE))
    assert sp.get_piece_size() == size <= 120
    assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (PAD_ID, EOS_ID, UNK_ID, -1)  # T5's ids
    for text in ["Clara built the river near the tower.", "Hugo sold the palace in 1857, near Felix, the garden?"]:
        assert sp.decode(sp.encode(text)) == text


def test_t5_tokenizer_matches_sentencepiece(tmp_path):
    train_sentencepiece(_texts(), 120, 1.0, tmp_path / SPM_FILE)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / SPM_FILE))
    tok = load_spm_tokenizer(tmp_path)
    assert len(tok) == sp.get_piece_size(), "no <extra_id_*> sentinels: the model's vocab is exactly the pieces"
    text = "Greta crossed the canyon near the glacier. Who visited the harbor?"
    assert tok(text)["input_ids"] == sp.encode(text) + [EOS_ID]
    assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text
    tok.save_pretrained(tmp_path / "saved")
    from transformers import AutoTokenizer

    again = AutoTokenizer.from_pretrained(tmp_path / "saved")
    assert len(again) == len(tok) and again(text)["input_ids"] == tok(text)["input_ids"]


def test_small_corpus_gets_fewer_pieces_with_a_warning(tmp_path, caplog):
    size = train_sentencepiece(["Alma built the river."] * 5, 500, 1.0, tmp_path / SPM_FILE)
    assert size < 500
    assert "fewer than vocab_size=500" in caplog.text
