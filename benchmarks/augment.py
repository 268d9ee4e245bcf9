"""Augment benchmark: question-generation throughput, batched (sorted by length) vs one-by-one, in one run.

Prints questions/s and generated tokens/s for
  1. one-by-one generation (batch 1, corpus order), the naive loop;
  2. batched generation sorted by length (what the augment stage does), and the speed-up over 1;
  3. on CUDA only: the batched path with a static KV cache vs the default dynamic cache.
Decoding is greedy with the same max_new_tokens everywhere, so every mode generates the same questions
(checked) and tokens/s compares like with like. Machines are noisy: the ratio is what to read.

Usage: python benchmarks/augment.py [--model models/qg] [--paragraphs 128] [--batch-size 32] [--device auto]
Paragraphs come from gensim's Wikipedia sample (offline). Without --model, ``models/qg`` is used when it
exists; otherwise a generator is built from params.yaml's qg_finetune.model with random weights and a
vocabulary trained on the sample (throughput only: its questions are noise, and it rarely stops early).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from distillpipe.config.base import load_section
from distillpipe.config.decoding import GreedyDecodingConfig
from distillpipe.config.qg_finetune import QgFinetuneConfig, QgScratchModelConfig
from distillpipe.data.sources.base import Skips
from distillpipe.data.sources.wiki import wiki_articles
from distillpipe.qg.finetune import build_scratch_t5
from distillpipe.qg.generate import decoding_kwargs, generate_questions
from distillpipe.qg.model import load_pretrained_t5, source_text
from distillpipe.qg.vocab import SPM_FILE, load_spm_tokenizer, train_sentencepiece
from distillpipe.runtime import resolve_device, seed_everything


def random_generator(folder: Path, texts: list[str]) -> Path:
    cfg = load_section("params.yaml", "qg_finetune", QgFinetuneConfig).model
    if not isinstance(cfg, QgScratchModelConfig):
        raise SystemExit("params.yaml's qg_finetune.model is not a scratch model: pass --model DIR")
    train_sentencepiece(texts, cfg.vocab_size, cfg.character_coverage, folder / SPM_FILE)
    tok = load_spm_tokenizer(folder)
    seed_everything(0)
    build_scratch_t5(cfg, len(tok)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def run(model, tok, sources, device, batch_size, sort, static=False) -> tuple[list, float, int]:
    kw = decoding_kwargs(GreedyDecodingConfig(kind="greedy"), 1, ARGS.max_new_tokens, 0)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    out, stats = generate_questions(model, tok, sources, kw, batch_size=batch_size, max_source_len=ARGS.max_source_len,
                                    device=device, seed=(0,), sort_by_length=sort, static_cache=static)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - t, stats.new_tokens


def report(name: str, n: int, seconds: float, tokens: int, base: float | None = None) -> float:
    qps = n / seconds
    extra = f"   x{qps / base:.1f} vs one-by-one" if base else ""
    print(f"{name:<34} {qps:8.1f} questions/s {tokens / seconds:10.0f} tokens/s{extra}")
    return qps


def main() -> None:
    device = resolve_device(ARGS.device)
    paragraphs = [p for a in wiki_articles(150, Skips()) for p in a.paragraphs]
    sources = [
        source_text(p, None) for p in paragraphs[:: max(1, len(paragraphs) // ARGS.paragraphs)][: ARGS.paragraphs]
    ]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = ARGS.model or (Path("models/qg") if Path("models/qg/config.json").is_file() else None)
        if model_dir is None:
            model_dir = random_generator(Path(tmp), paragraphs)
        model, tok = load_pretrained_t5(Path(model_dir))
    model.to(device).eval()
    print(f"generator {model_dir if ARGS.model or Path('models/qg/config.json').is_file() else '(random, from params)'}"
          f" on {device}: {len(sources)} paragraphs, greedy, max_new_tokens {ARGS.max_new_tokens}, "
          f"max_source_len {ARGS.max_source_len}, threads {torch.get_num_threads()}")
    run(model, tok, sources[:4], device, 4, True)  # warm-up
    one, t1, n1 = run(model, tok, sources, device, 1, False)
    base = report("one-by-one (batch 1)", len(sources), t1, n1)
    batched, t2, n2 = run(model, tok, sources, device, ARGS.batch_size, True)
    report(f"batched {ARGS.batch_size}, sorted by length", len(sources), t2, n2, base)
    same = sum(a == b for a, b in zip(one, batched))
    print(f"same questions batched and one-by-one: {same}/{len(sources)}")
    if device.type == "cuda":
        run(model, tok, sources[: ARGS.batch_size], device, ARGS.batch_size, True, static=True)  # compile
        _, t3, n3 = run(model, tok, sources, device, ARGS.batch_size, True, static=True)
        report(f"batched {ARGS.batch_size}, static KV cache", len(sources), t3, n3, base)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=None, help="generator folder (default: models/qg if present)")
    p.add_argument("--paragraphs", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--max-source-len", type=int, default=128)
    p.add_argument("--device", default="auto")
    ARGS = p.parse_args()
    main()
