"""The table of loss terms: the names the config, the schedule and the objective use all come from its rows, and
the objective computes each term with its row's formula, on the student block and teacher layer it aligns."""

import dataclasses
from pathlib import Path

import pytest
import torch

from distillpipe import losses
from distillpipe.config.base import build, load_params
from distillpipe.config.finetune import FinetuneConfig
from distillpipe.config.run import ObjectiveConfig
from distillpipe.config.train import TrainConfig
from distillpipe.config.train_aug import TrainAugConfig
from distillpipe.config.train_lm import TrainLMConfig
from distillpipe.data.collate import IGNORE
from distillpipe.pooling import pooled_mask
from distillpipe.store.schema import (
    EMBEDDINGS,
    END_LOGITS,
    LOGITS,
    MLM_LOGSUMEXP,
    MLM_POSITIONS,
    MLM_TOPK_IDS,
    MLM_TOPK_LOGITS,
    START_LOGITS,
    SignalSpec,
    attn_factor_arrays,
    attn_probs_array,
    attn_scores_array,
    hidden_array,
    subspace_arrays,
)
from distillpipe.students.base import LMOutput, StudentOutput
from distillpipe.train.objective import Objective, ObjectiveError, StudentDims, store_names
from distillpipe.train.schedule import AllOnes, all_terms
from distillpipe.train.terms import NAMES, TERMS, check_names

PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"
B, T, V, M, K, H = 2, 8, 30, 3, 4, 2


def _cfg(weights, layer_map=(0,), hidden_loss="mse"):
    return build(ObjectiveConfig, {"loss_weights": weights, "hidden_loss": hidden_loss, "layer_map": list(layer_map),
                                   "schedule": {"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 1.0,
                                                "temperature_decay": False}}, "objective")


def _in_order(names, among):
    return [n for n in names if n in among]


def test_the_schedule_and_the_accepted_names_are_the_table_s():
    # the seed terms keep their order (it is the order of the objective's sum: reordering changes a run's bits);
    # a new row may come anywhere without editing this test
    seeds = ("hard", "soft", "mlm_kd", "lm", "hidden", "attn", "attn_kl", "embedding")
    assert _in_order(NAMES, seeds) == list(seeds)
    assert NAMES == tuple(t.name for t in TERMS)
    layer = [t.name for t in TERMS if t.scope == "layer"]
    output = [t.name for t in TERMS if t.scope == "output"]
    # embedding first, then each aligned layer's terms in layer order, then the output terms
    assert all_terms([0, 2]) == ["embedding", *(f"{n}/0" for n in layer), *(f"{n}/2" for n in layer), *output]
    assert _in_order(all_terms([0, 2]), {"embedding", "hidden/0", "attn/0", "attn_kl/0", "hidden/2", "attn/2",
                                         "attn_kl/2", "hard", "soft", "mlm_kd", "lm"}) == [
        "embedding", "hidden/0", "attn/0", "attn_kl/0", "hidden/2", "attn/2", "attn_kl/2", "hard", "soft", "mlm_kd",
        "lm"]
    # every name the schedule knows is a term (it scheduled an "mlm" that no loss_weights could name)
    assert {t.split("/")[0] for t in all_terms([0])} == set(NAMES)


def test_an_unknown_name_is_refused_naming_the_known_ones():
    cfg = _cfg({"hard": 1.0, "hiden": 1.0})  # the config layer cannot know the table: it loads
    with pytest.raises(ObjectiveError, match=r"run r: objective: loss_weights: unknown term\(s\) \['hiden'\]; "
                                             r"known: \['hard', 'soft', .*'embedding'\]"):
        check_names(cfg, "run r: objective")
    dims = StudentDims(hidden=(4,), hidden_stride=1, attn_heads=(H,), embedding=0, lm=False)
    with pytest.raises(ObjectiveError, match="hiden"):
        Objective(cfg, kind="classification", signals=_signals(task="classification", n_classes=3), dims=dims)


@pytest.mark.parametrize("section,cls", [("train", TrainConfig), ("finetune", FinetuneConfig),
                                         ("train_aug", TrainAugConfig), ("train_lm", TrainLMConfig)])
def test_every_run_of_the_real_params_names_known_terms(section, cls):
    cfg = build(cls, load_params(PARAMS)[section], section, PARAMS)
    assert cfg.runs
    for name, run in cfg.runs.items():
        check_names(run.objective, f"{section}.runs.{name}")


def _signals(task="none", n_classes=0, pool=1, mlm=False, hidden=(), attn=(), probs=(), emb=0, hidden_rank=0,
             attn_rank=0):
    return SignalSpec(max_seq_len=T, pool=pool, task=task, n_classes=n_classes, vocab_size=V, mlm_topk=K if mlm else 0,
                      mlm_max_masked=M if mlm else 0, hidden_layers=hidden, hidden_size=6, attn_layers=attn,
                      n_heads=H, attn_probs_layers=probs, embedding_size=emb, hidden_rank=hidden_rank,
                      hidden_fit_rows=4 if hidden_rank else 0, attn_rank=attn_rank)


def _mask():
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 5:] = False
    return mask


def test_store_names_follow_the_table_order():
    cfg = _cfg({"embedding": 1.0, "attn": 1.0, "hidden": 1.0, "soft": 1.0, "hard": 1.0}, layer_map=(-1, 2, 1))
    assert store_names(cfg, "qa", _signals(task="qa")) == [  # the embedding output is derived: never read
        "length", "start_logits", "end_logits", "hidden/L2", "hidden/L1", "attn_scores/L2", "attn_scores/L1"]
    compact = _signals(task="qa", hidden=(1, 2), attn=(1, 2), hidden_rank=3, attn_rank=2)
    assert store_names(cfg, "qa", compact) == [  # the stored forms: coordinates, factors
        "length", "start_logits", "end_logits", "hidden/L2", "hidden/L1", "attn_scores/L2/left",
        "attn_scores/L2/right", "attn_scores/L1/left", "attn_scores/L1/right"]
    assert store_names(_cfg({"hard": 1.0, "mlm_kd": 1.0}), "mlm", _signals(mlm=True)) == [
        "length", "mlm/positions", "mlm/topk_ids", "mlm/topk_logits", "mlm/logsumexp"]


def test_each_output_term_is_its_formula():
    """hard and soft on classification and QA, hard and mlm_kd on an MLM corpus, lm (both forms): the objective's
    parts against the formulas of losses.py called by hand on the same tensors."""
    torch.manual_seed(0)
    mask, temp = _mask(), 2.0
    dims = StudentDims(hidden=(), hidden_stride=1, attn_heads=(), embedding=0, lm=False)

    out = StudentOutput(logits=torch.randn(B, 3))
    tg = {"attention_mask": mask, LOGITS: torch.randn(B, 3).half(), "labels": torch.tensor([2, IGNORE])}
    obj = Objective(_cfg({"hard": 1.0, "soft": 0.5}), kind="classification",
                    signals=_signals(task="classification", n_classes=3), dims=dims)
    total, parts = obj(out, tg, multipliers=AllOnes(), temperature=temp)
    hard = losses.hard_ce(out.logits, tg["labels"], IGNORE)
    soft = losses.soft_kl(out.logits, tg[LOGITS], temp)
    assert torch.equal(parts["hard"], hard) and torch.equal(parts["soft"], soft)
    assert torch.equal(total, 1.0 * hard + 0.5 * soft)

    out = StudentOutput(start_logits=torch.randn(B, T), end_logits=torch.randn(B, T))
    tg = {"attention_mask": mask, START_LOGITS: torch.randn(B, T).half(), END_LOGITS: torch.randn(B, T).half(),
          "start_positions": torch.tensor([IGNORE, 2]), "end_positions": torch.tensor([IGNORE, 4])}
    _, parts = Objective(_cfg({"hard": 1.0, "soft": 1.0}), kind="qa", signals=_signals(task="qa"), dims=dims)(
        out, tg, multipliers=AllOnes(), temperature=temp)
    keep = torch.tensor([False, True])  # the row without ground truth is left out of the span CE
    span_ce = losses.span_ce(out.start_logits[keep], out.end_logits[keep], tg["start_positions"][keep],
                             tg["end_positions"][keep], mask[keep])
    assert torch.equal(parts["hard"], span_ce)
    assert torch.equal(parts["soft"], losses.span_kd(out.start_logits, out.end_logits, tg[START_LOGITS],
                                                     tg[END_LOGITS], mask, temp))

    positions = torch.tensor([[1, 3, -1], [2, -1, -1]])
    out = StudentOutput(mlm_logits=torch.randn(B, M, V))
    tg = {"attention_mask": mask, "mlm_positions": positions, MLM_POSITIONS: positions.int(),
          "mlm_labels": torch.tensor([[4, 5, IGNORE], [6, IGNORE, IGNORE]]),
          MLM_TOPK_IDS: torch.randint(0, V, (B, M, K)).int(), MLM_TOPK_LOGITS: torch.randn(B, M, K).half(),
          MLM_LOGSUMEXP: torch.randn(B, M) + 4}
    _, parts = Objective(_cfg({"hard": 1.0, "mlm_kd": 1.0}), kind="mlm", signals=_signals(mlm=True), dims=dims)(
        out, tg, multipliers=AllOnes(), temperature=temp)
    slots = positions >= 0
    assert torch.equal(parts["hard"], losses.hard_ce(out.mlm_logits.flatten(0, 1), tg["mlm_labels"].flatten(), IGNORE))
    assert torch.equal(parts["mlm_kd"], losses.topk_kd(out.mlm_logits[slots], tg[MLM_TOPK_IDS][slots].long(),
                                                       tg[MLM_TOPK_LOGITS][slots], tg[MLM_LOGSUMEXP][slots], temp))

    lm_dims = dataclasses.replace(dims, lm=True)
    lm_obj = Objective(_cfg({"lm": 1.0}), kind="mlm", signals=_signals(), dims=lm_dims)
    vec = LMOutput(target_ids=torch.arange(5), vectors=torch.randn(5, 4), target_vectors=torch.randn(5, 4))
    _, parts = lm_obj(StudentOutput(lm=vec), {"attention_mask": mask}, multipliers=AllOnes(), temperature=1.0)
    assert torch.equal(parts["lm"], losses.continuous_cosine(vec.vectors, vec.target_vectors))
    nll = LMOutput(target_ids=torch.arange(5), logprob=-torch.rand(5))
    _, parts = lm_obj(StudentOutput(lm=nll), {"attention_mask": mask}, multipliers=AllOnes(), temperature=1.0)
    assert torch.equal(parts["lm"], losses.lm_nll(nll.logprob))


def test_each_layer_term_reads_its_aligned_teacher_layer():
    """layer_map (-1, 2, 1): student block 1 meets teacher layer 2, block 2 teacher layer 1 (block 0 nothing), for
    hidden (through W_h), attention scores (pooled 2x) and attention probabilities; and the embedding term."""
    torch.manual_seed(0)
    mask, pool = _mask(), 2
    L = T // pool
    out = StudentOutput(hidden=tuple(torch.randn(B, T, 4) for _ in range(3)), hidden_stride=1,
                        attn_scores=tuple(torch.randn(B, H, T, T) for _ in range(3)), embeddings=torch.randn(B, T, 5))
    tg = {"attention_mask": mask, EMBEDDINGS: torch.randn(B, T, 3).half(),
          **{hidden_array(t): torch.randn(B, L, 6).half() for t in (1, 2)},
          **{attn_scores_array(t): torch.randn(B, H, L, L).half() for t in (1, 2)},
          **{attn_probs_array(t): torch.softmax(torch.randn(B, H, T, T), -1).half() for t in (1, 2)}}
    dims = StudentDims(hidden=(4, 4, 4), hidden_stride=1, attn_heads=(H, H, H), embedding=5, lm=False)
    signals = _signals(task="qa", pool=pool, hidden=(1, 2), attn=(1, 2), probs=(1, 2), emb=3)
    obj = Objective(_cfg({"hidden": 1.0, "attn": 1.0, "attn_kl": 1.0, "embedding": 1.0}, layer_map=(-1, 2, 1)),
                    kind="qa", signals=signals, dims=dims)
    assert obj.terms() == ["embedding", "hidden/1", "hidden/2", "attn/1", "attn/2", "attn_kl/1", "attn_kl/2"]
    _, parts = obj(out, tg, multipliers=AllOnes(), temperature=1.0)
    valid = pooled_mask(mask, pool)
    for j, t in ((1, 2), (2, 1)):
        h = obj.hidden_proj(losses.pool_student_hidden(out.hidden[j], mask, pool))
        assert torch.equal(parts[f"hidden/{j}"], losses.hidden_mse(h, tg[hidden_array(t)], valid))
        scores = losses.pool_student_scores(out.attn_scores[j], mask, pool)
        assert torch.equal(parts[f"attn/{j}"], losses.attn_score_mse(scores, tg[attn_scores_array(t)], valid))
        assert torch.equal(parts[f"attn_kl/{j}"], losses.attn_kl(out.attn_scores[j], tg[attn_probs_array(t)], mask))
    assert torch.equal(parts["embedding"], losses.embedding_mse(obj.embed_proj(out.embeddings), tg[EMBEDDINGS], mask))


def test_each_term_checks_what_it_needs():
    """A row's check runs only when the term is weighted, and names the fix."""
    plain = StudentDims(hidden=(4,), hidden_stride=1, attn_heads=(), embedding=0, lm=False)
    cases = [({"soft": 1.0}, "mlm", plain, "on an MLM corpus use mlm_kd"),
             ({"mlm_kd": 1.0}, "classification", plain, "needs an MLM corpus"),
             ({"lm": 1.0}, "mlm", plain, "needs a language-model student"),
             ({"hard": 1.0}, "mlm", dataclasses.replace(plain, lm=True), "makes no MLM predictions"),
             ({"attn": 1.0}, "mlm", plain, "exposes no attention scores"),
             ({"embedding": 1.0}, "mlm", plain, "exposes no embeddings"),
             ({"embedding": 1.0}, "mlm", dataclasses.replace(plain, embedding=4), "does not keep")]
    assert {t.name for t in TERMS if t.check} >= {next(iter(w)) for w, *_ in cases}
    for weights, kind, dims, message in cases:
        with pytest.raises(ObjectiveError, match=message):
            Objective(_cfg(weights), kind=kind, signals=_signals(hidden=(0,), attn=(0,)), dims=dims)
    Objective(_cfg({"hard": 1.0}), kind="mlm", signals=_signals(), dims=plain)  # no check of unweighted terms


def test_layer_terms_on_compact_targets_are_their_subspace_and_factor_formulas():
    """A cache in the compact forms: the hidden term is the subspace MSE (or cosine) in the layer's basis, the attention
    MSE compares the scores rebuilt from the factors, the attention KL the softmax of the factors' scores."""
    from distillpipe.compact import probs_from_factors, scores_from_factors

    torch.manual_seed(1)
    mask, pool, r, ar = _mask(), 2, 3, 2
    L = T // pool
    out = StudentOutput(hidden=tuple(torch.randn(B, T, 4) for _ in range(2)), hidden_stride=1,
                        attn_scores=tuple(torch.randn(B, H, T, T) for _ in range(2)))
    bases = {t: torch.linalg.qr(torch.randn(6, r))[0] for t in (1, 2)}
    tg = {"attention_mask": mask,
          **{hidden_array(t): torch.randn(B, L, r).half() for t in (1, 2)},
          **{subspace_arrays(t)[0]: torch.randn(6) for t in (1, 2)},
          **{subspace_arrays(t)[1]: bases[t] for t in (1, 2)},
          **{a: torch.randn(B, H, ar, L).half() for t in (1, 2) for a in attn_factor_arrays(attn_scores_array(t))},
          **{a: torch.randn(B, H, ar, T).half() for t in (1, 2) for a in attn_factor_arrays(attn_probs_array(t))}}
    dims = StudentDims(hidden=(4, 4), hidden_stride=1, attn_heads=(H, H), embedding=0, lm=False)
    signals = _signals(task="qa", pool=pool, hidden=(1, 2), attn=(1, 2), probs=(1, 2), hidden_rank=r, attn_rank=ar)
    valid = pooled_mask(mask, pool)
    for hidden_loss, fn in (("mse", losses.subspace_mse), ("cosine", losses.subspace_cosine)):
        obj = Objective(_cfg({"hidden": 1.0, "attn": 1.0, "attn_kl": 1.0}, layer_map=(2, 1), hidden_loss=hidden_loss),
                        kind="qa", signals=signals, dims=dims)
        _, parts = obj(out, tg, multipliers=AllOnes(), temperature=1.0)
        for j, t in ((0, 2), (1, 1)):
            h = obj.hidden_proj(losses.pool_student_hidden(out.hidden[j], mask, pool))
            mean, basis = (tg[a] for a in subspace_arrays(t))
            assert torch.equal(parts[f"hidden/{j}"], fn(h, tg[hidden_array(t)], mean, basis, valid))
            scores = losses.pool_student_scores(out.attn_scores[j], mask, pool)
            target = scores_from_factors(*(tg[a] for a in attn_factor_arrays(attn_scores_array(t))))
            assert torch.equal(parts[f"attn/{j}"], losses.attn_score_mse(scores, target, valid))
            probs = probs_from_factors(*(tg[a] for a in attn_factor_arrays(attn_probs_array(t))), mask)
            assert torch.equal(parts[f"attn_kl/{j}"], losses.attn_kl(out.attn_scores[j], probs, mask))
