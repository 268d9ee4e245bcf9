"""``distillpipe word-vectors``: the ``word_vectors`` and ``word_vectors_local`` stages (ELMo-C's fixed word
embedding as a table over the teacher tokenizer's vocabulary)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from distillpipe.commands.base import ParamsOpt, entry_point, user_errors
from distillpipe.config.base import ConfigError, load_section
from distillpipe.config.tokenize import TokenizeConfig
from distillpipe.config.word_vectors import WordVectorsConfig
from distillpipe.data.fasttext import make_word_vectors


@user_errors
def word_vectors(name: Annotated[str, typer.Option("--name", help="table name (a key of word_vectors.tables or "
                                                   ".local)")],
                 out: Annotated[Path, typer.Option(help="output table folder")],
                 corpus: Annotated[Path | None, typer.Option(help="prepared corpus (trained tables)")] = None,
                 params: ParamsOpt = Path("params.yaml")) -> None:
    """Train FastText on a prepared corpus (or read a FastText .bin) and write its vectors for every token of the
    teacher tokenizer (tokenize.tokenizer)."""
    cfg = load_section(params, "word_vectors", WordVectorsConfig)
    tokenizer = load_section(params, "tokenize", TokenizeConfig).tokenizer
    if name in cfg.tables:
        tcfg = cfg.tables[name]
    elif name in cfg.local:
        tcfg = cfg.local[name]
    else:
        raise ConfigError(f"{params}: word_vectors has no table {name!r}; known: {sorted(cfg.tables)} (tables), "
                          f"{sorted(cfg.local)} (local)")
    typer.echo(make_word_vectors(name, tcfg, tokenizer, out, corpus_dir=corpus).one_line())


main = entry_point(word_vectors, "word-vectors")
