"""Batched generation: results come back in input order and match one-by-one generation (greedy); sampling is
reproducible for a seed and changes with it; beam search returns n distinct sequences per input."""

import pytest
import torch
from _qg_tiny import fresh_paragraphs

from distillpipe.config.decoding import BeamDecodingConfig, GreedyDecodingConfig, SampleDecodingConfig
from distillpipe.qg.generate import decoding_kwargs, generate_questions
from distillpipe.qg.model import load_pretrained_t5, source_text

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def gen(tiny_qg):
    model, tok = load_pretrained_t5(tiny_qg)
    # paragraphs of varied length, so that sorting by length reorders them and batches hold padding
    sources = [source_text(" ".join(p["text"] for p in fresh_paragraphs(1 + i % 4, seed=i)), None) for i in range(10)]
    return model.eval(), tok, sources


def _run(gen, decoding, n=1, batch_size=4, seed=(0,), **kw):
    model, tok, sources = gen
    out, stats = generate_questions(model, tok, sources, decoding_kwargs(decoding, n, 10, 0), batch_size=batch_size,
                                    max_source_len=40, device=CPU, seed=seed, **kw)
    return out, stats


def test_batched_sorted_greedy_equals_one_by_one(gen):
    greedy = GreedyDecodingConfig(kind="greedy")
    batched, stats = _run(gen, greedy, batch_size=4)
    single, _ = _run(gen, greedy, batch_size=1, sort_by_length=False)
    assert batched == single
    assert stats.inputs == 10 and stats.sequences == 10 and stats.truncated > 0  # 4-paragraph sources exceed 40
    assert 10 <= stats.new_tokens <= 10 * 10  # between one token (</s>) and max_new_tokens per question
    assert all(len(q) == 1 for q in batched)


def test_sampling_is_deterministic_for_a_seed(gen):
    sample = SampleDecodingConfig(kind="sample", temperature=1.0, top_k=0, top_p=1.0)
    a, _ = _run(gen, sample, n=3, seed=(7, 1))
    torch.manual_seed(1234)  # whatever ran before does not matter: each batch is seeded
    b, _ = _run(gen, sample, n=3, seed=(7, 1))
    c, _ = _run(gen, sample, n=3, seed=(7, 2))
    assert a == b
    assert a != c
    assert all(len(q) == 3 for q in a)


def test_beam_returns_n_distinct_sequences(gen):
    beam = BeamDecodingConfig(kind="beam", num_beams=4, length_penalty=1.0)
    out, stats = _run(gen, beam, n=3)
    assert stats.sequences == 30 and all(len(q) == 3 and len(set(q)) == 3 for q in out)


def test_decoding_kwargs():
    assert decoding_kwargs(GreedyDecodingConfig(kind="greedy"), 1, 20, 3) == {
        "max_new_tokens": 20, "num_return_sequences": 1, "no_repeat_ngram_size": 3, "do_sample": False, "num_beams": 1}
    kw = decoding_kwargs(SampleDecodingConfig(kind="sample", temperature=0.7, top_k=50, top_p=0.9), 2, 20, 0)
    assert (kw["do_sample"]
            and (kw["temperature"], kw["top_k"], kw["top_p"], kw["num_return_sequences"]) == (0.7, 50, 0.9, 2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_static_cache_bf16_matches_dynamic(gen):
    model, tok, sources = gen
    model = model.to("cuda")
    greedy = decoding_kwargs(GreedyDecodingConfig(kind="greedy"), 1, 10, 0)
    kw = {"batch_size": 4, "max_source_len": 40, "device": torch.device("cuda"), "seed": (0,)}
    static, _ = generate_questions(model, tok, sources, greedy, static_cache=True, **kw)
    dynamic, _ = generate_questions(model, tok, sources, greedy, static_cache=False, **kw)
    assert static == dynamic


def test_generated_lengths_count_up_to_the_first_eos():
    from distillpipe.qg.generate import generated_lengths

    eos, pad = 1, 0
    body = torch.tensor([[5, 6, eos, pad, pad],   # 3: the </s> counts, the padding after it does not
                         [5, pad, 7, 8, 9],       # 5: no </s>: every position was generated, <pad> included
                         [eos, pad, pad, pad, pad],
                         [5, eos, 6, eos, pad]])  # only the first </s> ends it
    assert generated_lengths(body, eos).tolist() == [3, 5, 1, 2]
