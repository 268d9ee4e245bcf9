"""Signal capture on tiny random BERTs, checked against the teacher's own outputs and manual math."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from _teacher_tiny import N_LAYERS, constants_for, live_forward, make_rows, manual_scores, spec_for, tiny_model

from distillpipe.pooling import SCORE_MASKED
from distillpipe.store.schema import SignalSpec
from distillpipe.teacher import capture as capture_mod
from distillpipe.teacher.batching import collate
from distillpipe.teacher.capture import capture_batch, signal_names

ALL = tuple(range(1, N_LAYERS + 1))
F16 = dict(rtol=2e-3, atol=2e-3)  # float16 storage of O(1) values


def hook_counts(model):
    """Forward hooks per module (transformers installs its own output-capturing hooks once)."""
    return [len(m._forward_hooks) for m in model.modules()]


@pytest.fixture(scope="module")
def batch():
    return collate(make_rows([13, 9, 5, 2]), pad_id=0)


def test_scores_equal_manual_qk_recomputation(tiny_teachers, batch):
    model = tiny_teachers["base"]
    out = capture_batch(model, batch, spec_for(model, attn_layers=ALL))
    live = live_forward(model, batch)
    mask = batch["attention_mask"].bool()
    pair = (mask[:, :, None] & mask[:, None, :])[:, None].expand(-1, model.config.num_attention_heads, -1, -1)
    for j in ALL:
        got = out[f"attn_scores/L{j}"]
        ref = manual_scores(model, live.hidden_states, j)
        assert got.dtype == torch.float16 and got.shape == ref.shape
        torch.testing.assert_close(got[pair].float(), ref[pair], **F16)
        assert torch.all(got[~pair] == float("-inf"))  # padded query or key: masked, not a number


def test_softmax_of_scores_equals_eager_attentions(tiny_teachers, batch):
    model = tiny_teachers["base"]
    out = capture_batch(model, batch, spec_for(model, attn_layers=ALL, attn_probs_layers=(2, 4)))
    live = live_forward(model, batch)
    q_valid = batch["attention_mask"].bool()[:, None, :, None]  # (B, 1, L, 1)
    for j in ALL:
        probs = torch.softmax(out[f"attn_scores/L{j}"].float(), dim=-1)  # -inf keys -> exactly 0
        ref = live.attentions[j - 1]
        torch.testing.assert_close(probs.masked_fill(~q_valid, 0), ref.masked_fill(~q_valid, 0), **F16)
    for j in (2, 4):
        got = out[f"attn_probs/L{j}"].float()
        torch.testing.assert_close(got, live.attentions[j - 1].masked_fill(~q_valid, 0), rtol=2e-3, atol=1e-3)


def test_hidden_and_derived_embeddings_equal_output_hidden_states(tiny_teachers, batch):
    model = tiny_teachers["base"]
    live = live_forward(model, batch)
    mask = batch["attention_mask"].bool()
    spec = spec_for(model, hidden_layers=(0, *ALL), embeddings=True)
    constants = constants_for(model, spec)
    out1 = capture_batch(model, batch, spec, constants=constants)
    out4 = capture_batch(model, batch, spec_for(model, hidden_layers=(0, *ALL), pool=4))
    assert "embeddings" not in out1  # derived: never an array of rows
    derived = constants.embeddings(batch["input_ids"], batch["token_type_ids"], mask)
    torch.testing.assert_close(derived[mask], live.hidden_states[0][mask], rtol=1e-5, atol=1e-5)
    assert torch.all(derived[~mask] == 0)
    for j in (0, *ALL):
        ref = live.hidden_states[j]
        torch.testing.assert_close(out1[f"hidden/L{j}"][mask].float(), ref[mask], **F16)
        assert torch.all(out1[f"hidden/L{j}"][~mask] == 0)
        # p = 4: the mean of the real tokens of each group of 4
        L = ref.shape[1]
        for b, n in enumerate(batch["lengths"].tolist()):
            for a in range(math.ceil(L / 4)):
                lo, hi = 4 * a, min(4 * a + 4, n)
                expect = ref[b, lo:hi].mean(0) if hi > lo else torch.zeros(ref.shape[-1])
                torch.testing.assert_close(out4[f"hidden/L{j}"][b, a].float(), expect, **F16)


def test_task_logits(tiny_teachers, batch):
    mask = batch["attention_mask"].bool()
    cls = tiny_teachers["classification"]
    out = capture_batch(cls, batch, spec_for(cls, task="classification"))
    torch.testing.assert_close(out["logits"].float(), live_forward(cls, batch).logits, **F16)
    assert out["logits"].shape == (4, 3)
    qa = tiny_teachers["qa"]
    out = capture_batch(qa, batch, spec_for(qa, task="qa", hidden_layers=(N_LAYERS,)))
    live = live_forward(qa, batch)
    for name in ("start_logits", "end_logits"):
        torch.testing.assert_close(out[name][mask].float(), getattr(live, name)[mask], **F16)
        assert torch.all(out[name][~mask] == 0)
    torch.testing.assert_close(out[f"hidden/L{N_LAYERS}"][mask].float(), live.hidden_states[-1][mask], **F16)


def test_mlm_topk_and_logsumexp_at_masked_positions(tiny_teachers):
    model = tiny_teachers["mlm"]
    rows = make_rows([14, 9, 6], seed=3, n_masked=[3, 1, 0])
    batch = collate(rows, pad_id=0)
    k = 7
    out = capture_batch(model, batch, spec_for(model, mlm_topk=k))
    full = live_forward(model, batch).logits  # (B, L, V): the reference the capture avoids computing
    M = 3
    assert out["mlm/topk_ids"].shape == (3, M, k) and out["mlm/topk_ids"].dtype == torch.int32
    assert out["mlm/logsumexp"].dtype == torch.float32
    for b, row in enumerate(rows):
        pos = row["masked_positions"]
        assert out["mlm/positions"][b].tolist() == pos + [-1] * (M - len(pos))
        for m, t in enumerate(pos):
            ref_vals, ref_ids = torch.topk(full[b, t], k)
            assert out["mlm/topk_ids"][b, m].tolist() == ref_ids.tolist()
            torch.testing.assert_close(out["mlm/topk_logits"][b, m].float(), ref_vals, **F16)
            torch.testing.assert_close(out["mlm/logsumexp"][b, m], torch.logsumexp(full[b, t], -1),
                                       rtol=1e-5, atol=1e-5)
        for m in range(len(pos), M):  # unused slots
            assert not out["mlm/topk_ids"][b, m].any() and not out["mlm/topk_logits"][b, m].any()
            assert out["mlm/logsumexp"][b, m] == 0


@pytest.mark.parametrize("kind", ["mlm", "qa", "classification"])
def test_row_signals_do_not_depend_on_batch_padding(tiny_teachers, kind):
    model = tiny_teachers[kind]
    mlm = kind == "mlm"
    rows = make_rows([6, 17, 11], seed=5, n_masked=[2, 5, 3] if mlm else None)
    spec = spec_for(model, task="none" if mlm else kind, mlm_topk=5 if mlm else 0, hidden_layers=(0, 2, 4),
                    attn_layers=(1, 3), attn_probs_layers=(3,), pool=4, embeddings=True)
    c = constants_for(model, spec)
    alone = capture_batch(model, collate(rows[:1], 0), spec, seq_len=20, max_masked=6, constants=c)
    padded = capture_batch(model, collate(rows, 0), spec, seq_len=20, max_masked=6, constants=c)
    assert alone.keys() == padded.keys() == set(signal_names(spec))
    for name in alone:
        a, b = alone[name][0], padded[name][0]
        assert a.shape == b.shape, name
        if a.is_floating_point():
            torch.testing.assert_close(a.float(), b.float(), rtol=2e-3, atol=2e-3, msg=name)
        else:
            assert torch.equal(a, b), name


def test_teacher_in_train_mode_is_refused(batch):
    model = tiny_model("base").train()
    with pytest.raises(AssertionError, match="eval"):
        capture_batch(model, batch, spec_for(model, hidden_layers=(1,)))


def test_only_selected_layers_are_captured(tiny_teachers, batch, monkeypatch):
    model = tiny_teachers["base"]
    hooks_before = hook_counts(model)
    computed = []
    real = capture_mod._attention_scores

    def counting(q, k, n_heads):
        computed.append(q)
        return real(q, k, n_heads)

    monkeypatch.setattr(capture_mod, "_attention_scores", counting)
    ran = []
    layers = model.encoder.layer
    spy = [layer.register_forward_hook(lambda m, a, o, i=i: ran.append(i + 1)) for i, layer in enumerate(layers)]
    queries = {}  # each layer's query projection output, to tell which layer a Q K^T was computed for
    spy += [layer.attention.self.query.register_forward_hook(lambda m, a, o, i=i: queries.__setitem__(i + 1, o))
            for i, layer in enumerate(layers)]
    try:
        out = capture_batch(model, batch, spec_for(model, hidden_layers=(1,), attn_layers=(2,), attn_probs_layers=(2,),
                                                   pool=2))
    finally:
        for h in spy:
            h.remove()
    assert set(out) == {"hidden/L1", "attn_scores/L2", "attn_probs/L2", "length"}
    assert len(computed) == 1 and computed[0] is queries[2]  # one QK^T, layer 2 only
    assert ran == [1, 2]  # nothing after the deepest selected layer runs
    assert hook_counts(model) == hooks_before  # capture hooks are gone


def test_hooks_are_removed_when_the_forward_fails(batch):
    model = tiny_model("base")
    hooks_before = hook_counts(model)
    bad = dict(batch, token_type_ids=torch.full_like(batch["token_type_ids"], 7))  # type vocab is 2
    with pytest.raises(IndexError):
        capture_batch(model, bad, spec_for(model, hidden_layers=(1,), attn_layers=(1, 2)))
    assert hook_counts(model) == hooks_before


def test_hooks_do_not_depend_on_the_attention_kernel(tiny_teachers, batch):
    """The same weights under sdpa attention give the same captured scores as under eager."""
    eager = tiny_teachers["base"]
    sdpa = tiny_model("base", attn_implementation="sdpa")
    sdpa.load_state_dict(eager.state_dict())
    assert sdpa.config._attn_implementation == "sdpa"
    spec = spec_for(eager, hidden_layers=(4,), attn_layers=ALL, pool=4)
    a, b = capture_batch(eager, batch, spec), capture_batch(sdpa, batch, spec)
    for name in a:
        torch.testing.assert_close(a[name].float(), b[name].float(), rtol=1e-3, atol=1e-3, msg=name)


def test_specs_the_teacher_cannot_serve_are_refused(tiny_teachers, batch):
    base = tiny_teachers["base"]
    with pytest.raises(ValueError, match="no MLM head"):
        capture_batch(base, batch, spec_for(base, mlm_topk=5))
    with pytest.raises(ValueError, match="task logits"):
        capture_batch(base, batch, spec_for(base, task="classification"))
    with pytest.raises(ValueError, match="task logits"):
        capture_batch(tiny_teachers["qa"], batch, spec_for(tiny_teachers["qa"], task="classification"))
    with pytest.raises(ValueError, match="only 4 layers"):
        capture_batch(base, batch, spec_for(base, attn_layers=(5,)))
    with pytest.raises(ValueError, match="layer 0"):
        capture_batch(base, batch, spec_for(base, attn_layers=(0,)))
    with pytest.raises(ValueError, match="strictly increasing"):
        spec_for(base, hidden_layers=(3, 1))
    with pytest.raises(ValueError, match="no signal"):
        capture_batch(base, batch, spec_for(base))
    with pytest.raises(ValueError, match="does not fit"):
        capture_batch(base, batch, spec_for(base, hidden_layers=(1,)), seq_len=8)


@pytest.mark.parametrize("field, value", [("hidden_size", 64), ("n_heads", 8), ("vocab_size", 101),
                                          ("n_classes", 2), ("embedding_size", 16)])
def test_a_spec_of_another_teacher_is_refused(tiny_teachers, batch, field, value):
    """A spec whose sizes are not the model's would give a store whose shapes lie about its teacher."""
    model = tiny_teachers["classification"]
    right = spec_for(model, task="classification", hidden_layers=(1,), embeddings=True)
    c = constants_for(model, right)
    capture_batch(model, batch, right, constants=c)  # the model's own sizes pass
    with pytest.raises(ValueError, match=rf"another teacher: {field}={value} \(the teacher has"):
        capture_batch(model, batch, dataclasses.replace(right, **{field: value}), constants=c)


@pytest.mark.parametrize("compact", [False, True], ids=["dense", "compact"])
@pytest.mark.parametrize("kind", ["mlm", "classification", "qa"])
def test_capture_fits_the_store_layout(tiny_teachers, kind, compact):
    """Names, row shapes, fill values and dtypes agree with store.schema's array layout."""
    from distillpipe.store.schema import ATTN_MASKED, array_layout

    model, mlm = tiny_teachers[kind], kind == "mlm"
    spec = SignalSpec(max_seq_len=20, pool=4, task="none" if mlm else kind,
                      n_classes=3 if kind == "classification" else 0,
                      vocab_size=100, mlm_topk=5 if mlm else 0, mlm_max_masked=6 if mlm else 0, hidden_layers=(0, 2),
                      hidden_size=32, attn_layers=(1, 4), n_heads=4, attn_probs_layers=(3,), embedding_size=32,
                      hidden_rank=5 if compact else 0, hidden_fit_rows=8 if compact else 0,
                      attn_rank=2 if compact else 0)
    assert float(ATTN_MASKED) == SCORE_MASKED  # what pooling marks empty blocks with is the store's fill value
    rows = make_rows([9, 4], seed=1, n_masked=[3, 1] if mlm else None)
    batch = collate(rows, 0)
    c = constants_for(model, spec, make_rows([12, 7, 10], seed=2, n_masked=[2, 2, 2] if mlm else None))
    out = capture_batch(model, batch, spec, seq_len=20, max_masked=6 if mlm else None, constants=c)
    raw = capture_batch(model, batch, spec, constants=c)  # batch-length shapes: what the padding adds to
    arrays = {a.name: a for a in array_layout(spec, n_rows=8, shard_rows=8)}
    assert set(out) == set(arrays) - {"row_index"} == set(signal_names(spec))
    for name, t in out.items():
        a = arrays[name]
        assert tuple(t.shape[1:]) == a.row_shape, name
        values = t.numpy()
        assert (values.dtype.kind == "f") == (a.dtype.kind == "f"), (name, t.dtype, a.dtype)
        assert np.array_equal(values.astype(a.dtype), values, equal_nan=values.dtype.kind == "f"), name  # lossless
        inside = (slice(None), *(slice(0, n) for n in raw[name].shape[1:]))
        assert torch.equal(t[inside], raw[name]), name
        added = torch.ones(t.shape, dtype=torch.bool)
        added[inside] = False
        assert torch.all(t[added].double() == float(a.fill_value)), name  # the store's fill value
        assert added.any() or name in ("length", "logits"), name  # the check above saw padding


# --------------------------------------------------------------------------------------------
# compact forms
# --------------------------------------------------------------------------------------------


def test_compact_hidden_are_the_pooled_states_coordinates_in_the_fitted_subspace(tiny_teachers, batch):
    """Coordinates c = U^T (h - mu) of the dense pooled states, in the basis the build's fit gives: the top-r
    eigenvectors of the covariance of the fit rows' pooled states (checked against numpy's eigh)."""
    from distillpipe.pooling import pooled_mask

    model = tiny_teachers["base"]
    fit_rows = make_rows([20, 17, 11, 30, 8, 25], seed=7)
    spec = spec_for(model, hidden_layers=(1, 4), pool=2, hidden_rank=6)
    c = constants_for(model, spec, fit_rows)
    dense = capture_batch(model, batch, spec_for(model, hidden_layers=(1, 4), pool=2))
    out = capture_batch(model, batch, spec, constants=c)
    valid = pooled_mask(batch["attention_mask"].bool(), 2)
    ref_states = capture_batch(model, collate(fit_rows, 0), spec_for(model, hidden_layers=(1, 4), pool=2))
    ref_valid = pooled_mask(collate(fit_rows, 0)["attention_mask"].bool(), 2)
    for j in (1, 4):
        x = ref_states[f"hidden/L{j}"][ref_valid].double().numpy()
        mu = x.mean(0)
        w, v = np.linalg.eigh(np.cov(x.T, bias=True))
        top = v[:, ::-1][:, :6]
        mean, basis = (t.double().numpy() for t in c.subspaces[j])
        np.testing.assert_allclose(mean, mu, atol=1e-3)
        np.testing.assert_allclose(np.abs(basis.T @ top), np.eye(6), atol=2e-2)  # the same directions (signs free)
        coords = out[f"hidden/L{j}"]
        assert coords.shape == (*dense[f"hidden/L{j}"].shape[:2], 6) and torch.all(coords[~valid] == 0)
        want = (dense[f"hidden/L{j}"].double().numpy() - mean) @ basis
        np.testing.assert_allclose(coords[valid].double().numpy(), want[valid.numpy()], rtol=2e-3, atol=2e-3)


def test_attention_factors_of_full_rank_give_back_the_scores_and_the_probabilities(tiny_teachers, batch):
    """A head's unpooled scores Q K^T have rank <= d_head (8 here): factors of that rank reproduce the dense scores
    (p = 1) and, from the row-centred ones, the attention probabilities."""
    from distillpipe.compact import probs_from_factors, scores_from_factors

    model = tiny_teachers["base"]
    mask = batch["attention_mask"].bool()
    pair = (mask[:, :, None] & mask[:, None, :])[:, None].expand(-1, 4, -1, -1)
    dense = capture_batch(model, batch, spec_for(model, attn_layers=(2,), attn_probs_layers=(3,)))
    out = capture_batch(model, batch, spec_for(model, attn_layers=(2,), attn_probs_layers=(3,), attn_rank=8))
    assert set(out) == {"length", "attn_scores/L2/left", "attn_scores/L2/right", "attn_probs/L3/left",
                        "attn_probs/L3/right"}
    scores = scores_from_factors(out["attn_scores/L2/left"], out["attn_scores/L2/right"])
    ref = dense["attn_scores/L2"][pair].float()
    # float16 factors: a score is a sum of r products larger than itself, so its error scales with the map's
    assert (scores[pair] - ref).abs().max() <= 1e-2 * ref.abs().max()
    probs = probs_from_factors(out["attn_probs/L3/left"], out["attn_probs/L3/right"], mask)
    torch.testing.assert_close(probs, dense["attn_probs/L3"].float(), rtol=1e-2, atol=2e-3)


def test_pooled_score_factors_are_the_best_low_rank_approximation(tiny_teachers):
    """Max-pooling breaks the rank: rank-2 factors of pooled maps leave a residual within 3% of the best rank-2 one
    (an exact SVD of each head's valid block), and nothing outside the valid blocks."""
    from distillpipe.compact import scores_from_factors
    from distillpipe.pooling import pooled_mask

    model = tiny_teachers["base"]
    batch = collate(make_rows([30, 23, 17, 9], seed=4), 0)
    dense = capture_batch(model, batch, spec_for(model, attn_layers=(1, 3), pool=2))
    out = capture_batch(model, batch, spec_for(model, attn_layers=(1, 3), pool=2, attn_rank=2))
    valid = pooled_mask(batch["attention_mask"].bool(), 2)
    for j in (1, 3):
        approx = scores_from_factors(out[f"attn_scores/L{j}/left"], out[f"attn_scores/L{j}/right"])
        for b, n in enumerate(valid.sum(1).tolist()):
            m = dense[f"attn_scores/L{j}"][b, :, :n, :n].double()
            best = torch.linalg.svdvals(m)[:, 2:].square().sum()
            got = (approx[b, :, :n, :n].double() - m).square().sum()
            assert got <= 1.03 * best + 1e-3, (j, b, float(got), float(best))
            assert torch.all(approx[b, :, n:, :] == 0) and torch.all(approx[b, :, :, n:] == 0)


def test_an_embedding_layer_that_computes_otherwise_is_refused(batch):
    """The store keeps the tables, not the rows: the capture checks the derived output against the teacher's own on
    every batch, so tables that do not give what the teacher computes fail before a row is written."""
    model = tiny_model("base")
    spec = spec_for(model, hidden_layers=(1,), embeddings=True)
    c = constants_for(model, spec)
    capture_batch(model, batch, spec, constants=c)
    with torch.no_grad():
        model.embeddings.LayerNorm.weight.mul_(1.01)  # the teacher changed; the tables did not
    with pytest.raises(ValueError, match="derived from the teacher's tables differs"):
        capture_batch(model, batch, spec, constants=c)


def test_roberta_positions_are_derived_as_roberta_counts_them():
    """RoBERTa counts positions from pad_id + 1 over the tokens that are not padding: the derived output equals its
    embedding module's."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.RobertaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=70, pad_token_id=1,
                                     type_vocab_size=1, attn_implementation="eager")
    model = transformers.RobertaModel(cfg).eval()
    rows = make_rows([13, 9, 5], seed=2)
    for r in rows:
        r["token_type_ids"] = [0] * r["length"]
    batch = collate(rows, pad_id=1)
    spec = spec_for(model, hidden_layers=(1,), embeddings=True)
    c = constants_for(model, spec)
    assert c.embeddings.positions == "after_padding" and c.embeddings.pad_id == 1
    capture_batch(model, batch, spec, constants=c)  # the per-batch check passes
    mask = batch["attention_mask"].bool()
    live = live_forward(model, batch).hidden_states[0]
    derived = c.embeddings(batch["input_ids"], batch["token_type_ids"], mask)
    torch.testing.assert_close(derived[mask], live[mask], rtol=1e-5, atol=1e-5)
