"""Tiny random-weight teachers of each architecture family (built from transformers' own config classes, no
download), and their tokenizers built locally in the layout the hub ships them in."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB, HIDDEN, HEADS, LAYERS = 100, 32, 4, 3
FAMILIES = ("bert", "roberta", "electra", "electra_small", "distilbert", "deberta_v2", "modernbert")
"""``electra_small``: ELECTRA with an embedding width (16) below the hidden width (32), as ELECTRA-small."""


def tiny_config(family: str, **over):
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  intermediate_size=64, max_position_embeddings=64, attn_implementation="eager")
    if family == "bert":
        cfg = tf.BertConfig(**common, **over)
    elif family == "roberta":  # positions count from pad_id + 1: two more position rows
        cfg = tf.RobertaConfig(**{**common, "max_position_embeddings": 66, "pad_token_id": 1}, **over)
    elif family in ("electra", "electra_small"):
        cfg = tf.ElectraConfig(**common, embedding_size=16 if family == "electra_small" else HIDDEN, **over)
    elif family == "distilbert":
        cfg = tf.DistilBertConfig(vocab_size=VOCAB, dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, hidden_dim=64,
                                  max_position_embeddings=64, attn_implementation="eager", **over)
    elif family == "deberta_v2":  # DeBERTa-v3's settings: relative c2p+p2c attention, no absolute positions
        cfg = tf.DebertaV2Config(**common, relative_attention=True, pos_att_type=["p2c", "c2p"],
                                 position_biased_input=False, position_buckets=16, max_relative_positions=-1,
                                 norm_rel_ebd="layer_norm", share_att_key=True, type_vocab_size=0, **over)
    elif family == "modernbert":  # every 3rd layer global, the others a local window of 8
        cfg = tf.ModernBertConfig(**common, global_attn_every_n_layers=3, local_attention=8, pad_token_id=0,
                                  **over)
    else:
        raise ValueError(family)
    return cfg


def tiny_model(family: str, head: str = "base", seed: int = 0, num_labels: int = 3, **over):
    """A random tiny teacher of ``family`` in eval mode; ``head`` in base, mlm, classification, qa."""
    import transformers as tf

    auto = {"base": tf.AutoModel, "mlm": tf.AutoModelForMaskedLM,
            "classification": tf.AutoModelForSequenceClassification, "qa": tf.AutoModelForQuestionAnswering}[head]
    torch.manual_seed(seed)
    cfg = tiny_config(family, **({"num_labels": num_labels} if head == "classification" else {}), **over)
    model = auto.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():  # scores of O(1), as a trained teacher's, so float16 storage is judged on real ranges
        for name, p in model.named_parameters():
            if name.endswith(("query.weight", "key.weight", "q_lin.weight", "k_lin.weight", "query_proj.weight",
                              "key_proj.weight", "Wqkv.weight")):
                p.normal_(0, 0.3)
            elif name.endswith(("classifier.weight", "qa_outputs.weight", "out_proj.weight")):
                p.normal_(0, 0.5)
    return model.eval()


SENTENCE = "The quick brown fox jumps over the lazy dog; distillation teaches students."
_CORPUS = [SENTENCE, "hello world of teachers and students", "the lazy dog sleeps", "quick brown foxes jump"] * 20


def save_hub_tokenizer(family: str, path: Path) -> Path:
    """Write a tokenizer of ``family`` into ``path`` with the files the hub's checkpoints ship: WordPiece
    ``vocab.txt`` (+ tokenizer.json) for BERT, ELECTRA and DistilBERT; ``vocab.json`` + ``merges.txt`` for
    RoBERTa; ``spm.model`` and no tokenizer.json for DeBERTa-v3; tokenizer.json only for ModernBERT."""
    import transformers as tf
    from tokenizers import ByteLevelBPETokenizer

    path.mkdir(parents=True, exist_ok=True)
    if family in ("bert", "electra", "electra_small", "distilbert"):
        words = sorted({w.strip(";.,").lower() for s in _CORPUS for w in s.split()} | {";", ".", ","})
        (path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
        cls = {"bert": "BertTokenizer", "distilbert": "DistilBertTokenizer"}.get(family, "ElectraTokenizer")
        (path / "tokenizer_config.json").write_text(f'{{"tokenizer_class": "{cls}", "do_lower_case": true}}\n')
        tf.AutoTokenizer.from_pretrained(path).save_pretrained(path)  # + tokenizer.json, as the hub has
    elif family == "roberta":
        bpe = ByteLevelBPETokenizer()
        bpe.train_from_iterator(_CORPUS, vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
        bpe.save_model(str(path))  # vocab.json, merges.txt
        (path / "tokenizer_config.json").write_text('{"tokenizer_class": "RobertaTokenizer"}\n')
        tf.AutoTokenizer.from_pretrained(path).save_pretrained(path)
    elif family == "deberta_v2":
        import sentencepiece as spm

        corpus = path / "corpus.txt"
        corpus.write_text("\n".join(_CORPUS) + "\n")
        spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(path / "spm"), vocab_size=60,
                                       hard_vocab_limit=False, pad_id=0, unk_id=3, bos_id=1, eos_id=2,
                                       user_defined_symbols=["[MASK]"], minloglevel=2)
        corpus.unlink()
        (path / "spm.vocab").unlink()
        # as microsoft/deberta-v3-*: spm.model and a tokenizer_config.json naming the class, no tokenizer.json
        (path / "tokenizer_config.json").write_text('{"tokenizer_class": "DebertaV2Tokenizer", '
                                                    '"do_lower_case": false}\n')
    elif family == "modernbert":
        bpe = ByteLevelBPETokenizer()
        bpe.train_from_iterator(_CORPUS, vocab_size=300, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]",
                                                                         "[MASK]"])
        tf.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", unk_token="[UNK]").save_pretrained(path)
    else:
        raise ValueError(family)
    return path
