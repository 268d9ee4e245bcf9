"""A distillation loss computed from captured (fp16, pooled, host round-tripped) signals equals the
same loss computed from the live fp32 teacher, for every signal type.

The reference losses below are written from the papers, independently of the capture code:
soft-target KD with temperature (Hinton; WaLDORf eq. 6), hidden MSE on avg-pooled states (eq. 2),
score MSE on masked max-pooled scores (eq. 4), top-k KD with the tail mass from the logsumexp,
attention KL (MiniALBERT) and embedding MSE (eq. 1).
"""

import pytest
import torch
from _teacher_tiny import live_forward, make_rows, manual_scores, spec_for

from distillpipe.pooling import avg_pool_seq, max_pool_scores
from distillpipe.teacher.batching import collate
from distillpipe.teacher.capture import capture_batch, to_host

T = 2.0
P = 4


def kd_soft(student, teacher, T, valid=None):
    """T^2 * KL(softmax(t/T) || softmax(s/T)) over the last axis, mean over rows; ``valid`` masks classes."""
    if valid is not None:
        student, teacher = student.masked_fill(~valid, float("-inf")), teacher.masked_fill(~valid, float("-inf"))
    pt = torch.softmax(teacher / T, dim=-1)
    log_ps = torch.log_softmax(student / T, dim=-1).masked_fill(pt == 0, 0.0)
    return T * T * (torch.xlogy(pt, pt) - pt * log_ps).sum(-1).mean()


def hidden_mse(student, teacher, valid):  # (B, n, d), (B, n)
    return (student - teacher)[valid].pow(2).mean()


def score_mse(student, teacher, valid):  # (B, H, n, n), valid (B, n, n): masked entries are never looked at
    v = valid[:, None].expand_as(student)
    return (student[v] - teacher[v]).pow(2).mean()


def topk_kd(student_logits, ids, t_logits, t_lse, valid):
    """Cross-entropy to the teacher's top-k probabilities plus its tail mass on the student's tail."""
    pt = torch.exp(t_logits - t_lse[..., None])  # (B, M, k)
    tail_t = (1 - pt.sum(-1)).clamp(min=0)
    logq = torch.log_softmax(student_logits, dim=-1).gather(-1, ids)
    tail_q = torch.log1p(-torch.exp(logq).sum(-1).clamp(max=1 - 1e-6))
    ce = -(pt * logq).sum(-1) - tail_t * tail_q
    return ce[valid].mean()


def attn_kl(student_probs, teacher_probs, q_valid):  # (B, H, L, L), (B, L)
    kl = (torch.xlogy(teacher_probs, teacher_probs) - teacher_probs * torch.log(student_probs.clamp(min=1e-12))).sum(-1)
    return kl[q_valid[:, None].expand_as(kl)].mean()


def live_signals(model, batch, spec):
    """The same signals straight from the fp32 teacher: its outputs, pooled by the tested pooling."""
    out = live_forward(model, batch)
    mask = batch["attention_mask"].bool()
    sig = {}
    for j in spec.hidden_layers:
        sig[f"hidden/L{j}"] = avg_pool_seq(out.hidden_states[j], mask, P)[0]
    for j in spec.attn_layers:
        sig[f"attn_scores/L{j}"] = max_pool_scores(manual_scores(model, out.hidden_states, j), mask, P)[0]
    for j in spec.attn_probs_layers:
        sig[f"attn_probs/L{j}"] = out.attentions[j - 1]
    if spec.embedding_size:
        sig["embeddings"] = out.hidden_states[0]
    if hasattr(out, "start_logits"):
        sig["start_logits"], sig["end_logits"] = out.start_logits, out.end_logits
    elif spec.task != "none":
        sig["logits"] = out.logits
    if spec.mlm_topk:
        pos = batch["masked_positions"]
        full = out.logits.gather(1, pos[..., None].expand(-1, -1, out.logits.shape[-1]))  # (B, M, V)
        sig["mlm/topk_logits"], sig["mlm/topk_ids"] = full.topk(spec.mlm_topk, dim=-1)
        sig["mlm/logsumexp"] = torch.logsumexp(full, dim=-1)
        sig["mlm/full"] = full
    return sig


def total_loss(sig, student, batch, spec):
    """Every loss the cached signals feed, as a dict (so a failure names the signal)."""
    mask = batch["attention_mask"].bool()
    pooled_valid = avg_pool_seq(torch.zeros(*mask.shape, 1), mask, P)[1]
    block_valid = max_pool_scores(torch.zeros(mask.shape[0], 1, *mask.shape[1:2] * 2), mask, P)[1]
    losses = {}
    for j in spec.hidden_layers:
        losses[f"hidden/L{j}"] = hidden_mse(student[f"hidden/L{j}"], sig[f"hidden/L{j}"], pooled_valid)
    for j in spec.attn_layers:
        losses[f"attn_scores/L{j}"] = score_mse(student[f"attn_scores/L{j}"], sig[f"attn_scores/L{j}"], block_valid)
    for j in spec.attn_probs_layers:
        losses[f"attn_probs/L{j}"] = attn_kl(student[f"attn_probs/L{j}"], sig[f"attn_probs/L{j}"], mask)
    if spec.embedding_size:
        losses["embeddings"] = (student["embeddings"] - sig["embeddings"])[mask].pow(2).mean()
    for name in ("start_logits", "end_logits"):
        if name in sig:
            losses[name] = kd_soft(student[name], sig[name], T, valid=mask)
    if "logits" in sig:
        losses["logits"] = kd_soft(student["logits"], sig["logits"], T)
    if spec.mlm_topk:
        losses["mlm"] = topk_kd(student["mlm/full"], sig["mlm/topk_ids"].long(), sig["mlm/topk_logits"],
                                sig["mlm/logsumexp"], batch["masked_valid"])
    return losses


def through_store(tmp_path, model, spec, batch):
    """Capture, write one shard of a real store (and its constants), read it back: exactly what training reads,
    the embedding output derived from the store's tables as training derives it."""
    import numpy as np

    from distillpipe.store import constants as store_constants
    from distillpipe.store.manifest import Manifest, TeacherInfo
    from distillpipe.store.reader import open_store
    from distillpipe.store.resume import create_or_resume
    from distillpipe.teacher.fit import fit_constants

    B, L = batch["input_ids"].shape
    path = tmp_path / "s.zarr"
    manifest = Manifest(teacher=TeacherInfo(name="tiny", weights_sha256="0" * 64, tokenizer_sha256="0" * 64, config={}),
                        tokens_fingerprint="toy", split="train", signals=spec, compute={"precision": "fp32"},
                        code={}, n_rows=B, shard_rows=B)
    writer = create_or_resume(path, manifest)
    store_constants.write_constants(path, *fit_constants(model, None, spec, B, 0))
    constants = store_constants.load(path, spec)
    arrays = to_host(capture_batch(model, batch, spec, seq_len=L, max_masked=spec.mlm_max_masked or None,
                                   constants=constants))
    writer.write_shard(0, {"row_index": np.arange(B), **arrays})
    writer.finalize()
    store = open_store(path, expected=manifest)
    out = {k: torch.from_numpy(np.asarray(v)) for k, v in store.read(store.arrays, 0, B).items() if k != "row_index"}
    if spec.embedding_size:
        derived = store_constants.load(path, spec).embeddings
        out["embeddings"] = derived(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"].bool())
    return out


@pytest.mark.parametrize("kind", ["mlm", "classification", "qa"])
def test_loss_from_cached_signals_equals_loss_from_live_teacher(tiny_teachers, kind, tmp_path):
    model = tiny_teachers[kind]
    mlm = kind == "mlm"
    batch = collate(make_rows([19, 12, 7, 3], seed=11, n_masked=[4, 2, 1, 1] if mlm else None), pad_id=0)
    spec = spec_for(model, task="none" if mlm else kind, mlm_topk=8 if mlm else 0, hidden_layers=(0, 2, 4),
                    attn_layers=(1, 2, 4), attn_probs_layers=(2, 4), pool=P, embeddings=True,
                    max_seq_len=batch["input_ids"].shape[1], mlm_max_masked=batch["masked_positions"].shape[1] if mlm
                    else None)
    live = live_signals(model, batch, spec)
    # What a training run sees: the capture written to a real store, read back, then widened.
    cached = through_store(tmp_path, model, spec, batch)
    cached = {k: v.float() if v.is_floating_point() else v.long() for k, v in cached.items()}
    cached["mlm/full"] = live.get("mlm/full")

    g = torch.Generator().manual_seed(0)
    student = {}
    for name, t in live.items():  # a student that is close to, but not at, the teacher
        if name in ("mlm/topk_ids", "mlm/topk_logits", "mlm/logsumexp"):
            continue
        finite = torch.where(torch.isfinite(t), t, torch.zeros_like(t))
        student[name] = finite + 0.3 * finite.std() * torch.randn(t.shape, generator=g)
    for j in spec.attn_probs_layers:  # students emit probabilities
        student[f"attn_probs/L{j}"] = torch.softmax(torch.randn(live[f"attn_probs/L{j}"].shape, generator=g), -1)

    from_live, from_cache = total_loss(live, student, batch, spec), total_loss(cached, student, batch, spec)
    assert from_live.keys() == from_cache.keys()
    expected = {"hidden/L0", "hidden/L2", "hidden/L4", "attn_scores/L1", "attn_scores/L2", "attn_scores/L4",
                "attn_probs/L2", "attn_probs/L4", "embeddings"}
    expected |= {"mlm"} if mlm else {"start_logits", "end_logits"} if kind == "qa" else {"logits"}
    assert set(from_live) == expected
    for name in from_live:
        assert torch.isfinite(from_live[name]) and from_live[name] > 0, name
        torch.testing.assert_close(from_cache[name], from_live[name], rtol=5e-3, atol=0.0, msg=name)
