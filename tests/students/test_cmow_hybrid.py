"""CMOW/CBOW-Hybrid student against naive products and sums computed from its embedding tables."""

import pytest
import torch
import torch.nn.functional as F

from distillpipe.config.students import CMOWHybridConfig, HeadConfig
from distillpipe.students.base import TaskSpec
from distillpipe.students.cmow_hybrid import CMOWHybrid
from distillpipe.students.heads import diffcat

V, D, DVEC = 50, 4, 8



def model_cfg(variant="hybrid", bidirectional=True, dropout=0.0, init_std=0.01, d=D, d_vec=DVEC):
    return CMOWHybridConfig(
        student="cmow_hybrid",
        variant=variant,
        bidirectional=bidirectional,
        d=d,
        d_vec=d_vec,
        init_std=init_std,
        embedding_init="random",
        dropout=dropout,
    )


def task(kind="classification", encoding="joint", head="mlp", vocab=V):
    head_cfg = HeadConfig(type=head, hidden_size=16, dropout=0.0) if kind == "classification" else None
    return TaskSpec(
        kind=kind,
        vocab_size=vocab,
        max_seq_len=32,
        pad_id=0,
        num_labels=2 if head_cfg else 0,
        encoding=encoding,
        head=head_cfg,
    )


def make(variant="hybrid", bidirectional=True, seed=0, init_std=0.3, **kw):
    """A model in eval mode; a large init_std by default so that the matrices are far from commuting."""
    torch.manual_seed(seed)
    return CMOWHybrid(model_cfg(variant, bidirectional, init_std=init_std), task(**kw)).eval()


def padded_batch(lengths, L=None, seed=0):
    """Right-padded rows of the given lengths. Pad positions hold random ids (the mask, not the pad id,
    marks padding) and real tokens include id 0 (= pad_id), which must count as a token."""
    g = torch.Generator().manual_seed(seed)
    L = L or max(lengths)
    ids = torch.randint(0, V, (len(lengths), L), generator=g)
    ids[0, 0] = 0
    mask = torch.arange(L)[None] < torch.tensor(lengths)[:, None]
    return ids, mask


# ---------------------------------------------------------------------------------------- references


def mat(model, table, token):
    return getattr(model, table).weight[token].view(D, D)


def naive_token_reps(model, ids_row, n, bidirectional=True):
    """[X_1..X_i, X_n..X_i, sum_{j<=i} x_j, sum_{j>=i} x_j] for i < n, from the tables, by python loops."""
    reps = []
    for i in range(n):
        P = torch.eye(D)
        for j in range(i + 1):
            P = P @ mat(model, "X_fw", ids_row[j])
        parts = [P.flatten()]
        if bidirectional:
            S = torch.eye(D)
            for j in range(n - 1, i - 1, -1):
                S = S @ mat(model, "X_bw", ids_row[j])
            parts.append(S.flatten())
        x = model.x_cbow.weight
        parts.append(sum(x[ids_row[j]] for j in range(i + 1)))
        if bidirectional:
            parts.append(sum(x[ids_row[j]] for j in range(i, n)))
        reps.append(torch.cat(parts))
    return torch.stack(reps)


def naive_seq(model, ids_row, n, bidirectional=True):
    Pf, Pb = torch.eye(D), torch.eye(D)
    for j in range(n):
        Pf = Pf @ mat(model, "X_fw", ids_row[j])
        if bidirectional:
            Pb = mat(model, "X_bw", ids_row[j]) @ Pb  # X_n ... X_1
    mats = [Pf.flatten(), Pb.flatten()] if bidirectional else [Pf.flatten()]
    return torch.cat([*mats, model.x_cbow.weight[ids_row[:n]].sum(0)])


# ---------------------------------------------------------------------------------------- tests


def test_init_near_identity():
    torch.manual_seed(0)
    model = CMOWHybrid(model_cfg(init_std=0.01), task())
    for table in (model.X_fw, model.X_bw):
        dev = table.weight - torch.eye(D).flatten()
        # E|N(0, s^2)| = s * sqrt(2/pi) ~ 0.8 s
        assert 0.7e-2 < dev.abs().mean() < 0.9e-2
    assert 0.9e-2 < model.x_cbow.weight.std() < 1.1e-2


@pytest.mark.parametrize("bidirectional", [True, False])
def test_per_token_alignment_from_tables(bidirectional):
    model = make(bidirectional=bidirectional)
    lengths = [7, 4, 1]
    ids, mask = padded_batch(lengths, seed=1)
    with torch.no_grad():
        enc = model.encode(ids, mask, tokens=True)
        for r, n in enumerate(lengths):
            ref = naive_token_reps(model, ids[r], n, bidirectional)
            torch.testing.assert_close(enc.tokens[r, :n], ref, rtol=1e-5, atol=1e-5)
            assert (enc.tokens[r, n:] == 0).all()
            ref = naive_seq(model, ids[r], n, bidirectional)
            torch.testing.assert_close(enc.seq[r], ref, rtol=1e-5, atol=1e-5)


def test_backward_state_is_aligned_not_reversed():
    """Position 0's backward part is the whole backward product (X_n..X_1), the last token's is X_n alone."""
    model = make()
    ids, mask = padded_batch([5, 3], L=6)
    with torch.no_grad():
        tok = model.encode(ids, mask, tokens=True).tokens
    bw = slice(D * D, 2 * D * D)
    for r, n in enumerate([5, 3]):
        torch.testing.assert_close(tok[r, n - 1, bw], mat(model, "X_bw", ids[r, n - 1]).flatten())
        assert not torch.allclose(tok[r, 0, bw], mat(model, "X_bw", ids[r, 0]).flatten(), atol=1e-3)


def test_sequence_encoding_paths_agree():
    model = make()
    ids, mask = padded_batch([9, 6, 2], seed=2)
    with torch.no_grad():
        tree = model.encode(ids, mask, tokens=False).seq
        scan = model.encode(ids, mask, tokens=True).seq
        ref = torch.stack([naive_seq(model, ids[r], n) for r, n in enumerate([9, 6, 2])])
    torch.testing.assert_close(tree, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scan, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head", ["mlp", "cnn", "bilstm"])
def test_padding_does_not_change_outputs(head):
    model = make(head=head)
    ids, mask = padded_batch([3, 8, 5], seed=3)
    row, n = 0, 3
    with torch.no_grad():
        alone = model({"input_ids": ids[row : row + 1, :n], "attention_mask": mask[row : row + 1, :n]},
                      return_hidden=True)
        batched = model({"input_ids": ids, "attention_mask": mask}, return_hidden=True)
    torch.testing.assert_close(alone.logits, batched.logits[row : row + 1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(alone.hidden[0], batched.hidden[0][row : row + 1, :n], rtol=1e-5, atol=1e-6)


def test_padding_does_not_change_mlm_logits():
    model = make(kind="mlm")
    ids, mask = padded_batch([4, 8], seed=4)
    pos = torch.tensor([[0, 3, -1], [2, 7, 5]])
    with torch.no_grad():
        alone = model({"input_ids": ids[:1, :4], "attention_mask": mask[:1, :4], "mlm_positions": pos[:1]})
        batched = model({"input_ids": ids, "attention_mask": mask, "mlm_positions": pos})
    torch.testing.assert_close(alone.mlm_logits[:, :2], batched.mlm_logits[:1, :2], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", ["hybrid", "cmow", "cbow"])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_dimensions(variant, bidirectional):
    model = make(variant, bidirectional)
    n_dir = 2 if bidirectional else 1
    mat_f, vec_f = D * D * (variant != "cbow"), DVEC * (variant != "cmow")
    assert model.seq_features == n_dir * mat_f + vec_f  # the whole-sequence CBOW sum is included once
    assert model.token_features == n_dir * (mat_f + vec_f)
    ids, mask = padded_batch([5, 3])
    with torch.no_grad():
        out = model({"input_ids": ids, "attention_mask": mask}, return_hidden=True)
        plain = model({"input_ids": ids, "attention_mask": mask})
        enc = model.encode(ids, mask, tokens=True)
    assert out.logits.shape == (2, 2)
    # inference skips the per-token scans unless asked: same logits, no hidden states
    assert plain.hidden == () and torch.equal(plain.logits, out.logits)
    assert out.hidden[0].shape == (2, 5, model.token_features) and out.hidden_stride == 1
    assert enc.seq.shape == (2, model.seq_features)
    assert model.encode(ids, mask, tokens=False).seq.shape == (2, model.seq_features)
    embeddings = sum(p.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters())
    assert embeddings == V * (n_dir * mat_f + vec_f)


@pytest.mark.parametrize("head", ["linear", "bilstm"])
def test_diffcat_of_separate_encodings(head):
    model = make(encoding="diffcat", head=head)
    a_ids, a_mask = padded_batch([5, 2, 4], seed=5)
    b_ids, b_mask = padded_batch([3, 6, 1], seed=6)
    seen = {}
    model.head.classifier.register_forward_pre_hook(lambda m, inp: seen.setdefault("x", inp[0]))
    batch = {"a_input_ids": a_ids, "a_attention_mask": a_mask, "b_input_ids": b_ids, "b_attention_mask": b_mask}
    with torch.no_grad():
        out = model(batch)
        ea = model.encode(a_ids, a_mask, tokens=True)
        eb = model.encode(b_ids, b_mask, tokens=True)
        ua, ub = model.head.pool(ea.seq, ea.tokens, a_mask), model.head.pool(eb.seq, eb.tokens, b_mask)
    assert out.logits.shape == (3, 2) and out.hidden == ()
    expected = torch.cat([ua, (ua - ub).abs(), ub], dim=-1)
    torch.testing.assert_close(seen["x"], expected, rtol=1e-5, atol=1e-6)
    if head == "linear":  # the sequence encodings themselves, [a, |a-b|, b]
        assert seen["x"].shape == (3, 3 * model.seq_features)
        torch.testing.assert_close(seen["x"], diffcat(ea.seq, eb.seq), rtol=1e-5, atol=1e-6)


def test_mlm_logits_and_unused_slots():
    model = make(kind="mlm")
    ids, mask = padded_batch([6, 4], seed=7)
    pos = torch.tensor([[1, 5, -1], [0, -1, -1]])
    out = model({"input_ids": ids, "attention_mask": mask, "mlm_positions": pos})
    assert out.mlm_logits.shape == (2, 3, V) and torch.isfinite(out.mlm_logits).all()
    assert out.hidden[0].shape == (2, 6, model.token_features)
    out.mlm_logits[pos >= 0].logsumexp(-1).sum().backward()
    assert model.mlm_head.weight.grad is not None and model.X_fw.weight.grad.abs().sum() > 0
    with torch.no_grad():  # the used slots do not depend on what the unused ones hold
        other = model({"input_ids": ids, "attention_mask": mask, "mlm_positions": torch.where(pos >= 0, pos, 3)})
    torch.testing.assert_close(other.mlm_logits[pos >= 0], out.mlm_logits[pos >= 0].detach())


def test_mlm_reads_the_context_of_the_masked_position():
    """At position i the MLM head sees P_{i-1} || S_{i+1} || sum_{j<i} x_j || sum_{j>i} x_j (naive reference,
    including i = 0 and the last real token before padding), so the token at i itself never matters."""
    model = make(kind="mlm")
    ids, mask = padded_batch([6, 4], L=6, seed=8)
    pos = torch.tensor([[0, 2, 5], [3, 1, -1]])
    with torch.no_grad():
        enc = model.encode(ids, mask, tokens=True)
        ctx = model.context_reps(enc, pos)
        for r, n in enumerate([6, 4]):
            for k in range(3):
                i = int(pos[r, k])
                if i < 0:
                    continue
                P, S = torch.eye(D), torch.eye(D)
                for j in range(i):
                    P = P @ mat(model, "X_fw", ids[r, j])
                for j in range(n - 1, i, -1):
                    S = S @ mat(model, "X_bw", ids[r, j])
                x = model.x_cbow.weight
                left = x[ids[r, :i]].sum(0)
                right = x[ids[r, i + 1 : n]].sum(0)
                torch.testing.assert_close(
                    ctx[r, k], torch.cat([P.flatten(), S.flatten(), left, right]), rtol=1e-5, atol=1e-5
                )
        batch = {"input_ids": ids, "attention_mask": mask, "mlm_positions": pos}
        before = model(batch).mlm_logits
        changed = ids.clone()
        changed[0, 2] = (ids[0, 2] + 1) % V  # the token at a predicted position
        after = model({**batch, "input_ids": changed}).mlm_logits
    torch.testing.assert_close(after[0, 1], before[0, 1])  # its own prediction: unchanged
    assert not torch.allclose(after[0, 0], before[0, 0])  # its neighbours' predictions: changed


def test_overfits_one_batch():
    torch.manual_seed(0)
    model = CMOWHybrid(model_cfg(), task())
    ids, mask = padded_batch([6, 5, 6, 3, 4, 6, 2, 5], seed=9)
    y = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        opt.zero_grad()
        loss = F.cross_entropy(model({"input_ids": ids, "attention_mask": mask}).logits, y)
        loss.backward()
        opt.step()
    assert loss.item() < 0.05


def test_training_dropout_keeps_products_alive():
    """Dropout acts on X - I: a 64-token product keeps its scale in training (plain dropout on X would zero
    each diagonal direction with probability 1 - 0.9^64 and collapse it)."""
    torch.manual_seed(0)
    model = CMOWHybrid(model_cfg(variant="cmow", bidirectional=False, dropout=0.1, init_std=0.01), task())
    ids = torch.randint(0, V, (16, 64))
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        model.eval()
        ev = model.encode(ids, mask, tokens=False).seq.norm(dim=-1)
        model.train()
        tr = model.encode(ids, mask, tokens=False).seq.norm(dim=-1)
    ratio = (tr / ev).median().item()
    assert 0.8 < ratio < 1.3, ratio


def test_products_stay_fp32_under_autocast():
    model = make(kind="mlm")
    ids, mask = padded_batch([6, 4])
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            enc = model.encode(ids, mask, tokens=True)
        ref = model.encode(ids, mask, tokens=True)
    assert enc.scans["P"].dtype == torch.float32 and enc.scans["S"].dtype == torch.float32
    torch.testing.assert_close(enc.seq, ref.seq)


def test_qa_is_refused():
    qa = TaskSpec(kind="qa", vocab_size=V, max_seq_len=32, pad_id=0, num_labels=0, encoding="joint", head=None)
    with pytest.raises(ValueError, match="QA"):
        CMOWHybrid(model_cfg(), qa)


def test_paper_size_parameter_counts():
    """CMOW paper, Table XIII, bidirectional hybrid with DiffCat, 2 classes: MLP (1,000 hidden units)
    40,231,402 parameters, CNN 36,638,164 (embeddings: 30,522 x (400 + 400 + 400) = 36,626,400)."""
    cfg = model_cfg(d=20, d_vec=400)
    for head, hidden, expected in (("mlp", 1000, 40_231_402), ("cnn", 16, 36_638_164)):
        spec = TaskSpec(
            kind="classification",
            vocab_size=30522,
            max_seq_len=64,
            pad_id=0,
            num_labels=2,
            encoding="diffcat",
            head=HeadConfig(type=head, hidden_size=hidden, dropout=0.1),
        )
        with torch.device("meta"):  # counts only: no 146 MB of weights on the CPU
            model = CMOWHybrid(cfg, spec)
        assert sum(p.numel() for p in model.parameters()) == expected


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    model = make(kind="mlm")
    ids, mask = padded_batch([6, 4], seed=10)
    batch = {"input_ids": ids, "attention_mask": mask, "mlm_positions": torch.tensor([[1, 4], [0, 3]])}
    with torch.no_grad():
        cpu = model(batch)
        gpu = model.cuda()({k: v.cuda() for k, v in batch.items()})
    torch.testing.assert_close(gpu.mlm_logits.cpu(), cpu.mlm_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gpu.hidden[0].cpu(), cpu.hidden[0], rtol=1e-4, atol=1e-4)
