"""The embedded generator's vocabulary: a SentencePiece unigram model trained on the QA train texts,
loaded as a ``T5Tokenizer`` (T5 ids: <pad> 0, </s> 1, <unk> 2, no <s>; no sentinel tokens)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

SPM_FILE = "spiece.model"
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2


def train_sentencepiece(texts: Iterable[str], vocab_size: int, character_coverage: float, out_file: str | Path) -> int:
    """Train a unigram model on ``texts`` and write it to ``out_file``; return its vocabulary size.

    One training thread and no input sampling, so the same texts give a byte-identical model (a
    resumed fine-tuning checks that its vocabulary is the one its checkpoint was trained with).
    ``vocab_size`` is a soft limit: a corpus too small for it gets fewer pieces, with a warning.
    """
    import sentencepiece as spm

    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError("no text to train a SentencePiece vocabulary on")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size, model_type="unigram",
        character_coverage=character_coverage, pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
        hard_vocab_limit=False, max_sentence_length=1 << 16, num_threads=1, minloglevel=2)
    Path(out_file).write_bytes(model.getvalue())
    size = spm.SentencePieceProcessor(model_file=str(out_file)).get_piece_size()
    if size < vocab_size:
        log.warning("SentencePiece: the corpus supports %d pieces, fewer than vocab_size=%d", size, vocab_size)
    return size


def load_spm_tokenizer(folder: str | Path):
    """A fast ``T5Tokenizer`` built from ``folder/spiece.model`` (no <extra_id_*> sentinels)."""
    from transformers import T5Tokenizer

    folder = Path(folder)
    if not (folder / SPM_FILE).is_file():
        raise FileNotFoundError(f"{folder / SPM_FILE} not found")
    tok = T5Tokenizer.from_pretrained(str(folder), extra_ids=0)
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (PAD_ID, EOS_ID, UNK_ID)
    return tok
