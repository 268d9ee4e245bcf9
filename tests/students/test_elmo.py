"""The ELMo-C student and its baselines: the LM loss against a naive loop, causality of each direction,
trainable parameter counts by hand, and frozen-feature tuning (only the scalar mix and the head train)."""

import math
from types import SimpleNamespace

import pytest
import torch

from distillpipe import losses
from distillpipe.config.base import build
from distillpipe.config.run import ObjectiveConfig
from distillpipe.config.students import ElmoConfig, HeadConfig
from distillpipe.data.collate import collate
from distillpipe.students import build_student
from distillpipe.students.base import TaskSpec, freeze_for_tuning, set_input_vectors
from distillpipe.train.objective import Objective, probe_student

V, E = 40, 6
SPECIAL = [0, 1, 2, 3, 4]  # [PAD] [UNK] [CLS] [SEP] [MASK]: zero rows in the table


def _cfg(output="continuous", **over):
    c = {"student": "elmo", "d_input": E, "output": output, "d_hidden": 12, "d_proj": 5, "n_layers": 2,
         "adaptive_cutoffs": [10, 25], "adaptive_div_value": 2.0, "dropout": 0.0, "init_std": 0.1}
    c.update(over)
    return build(ElmoConfig, c, "model")


def _table(seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(V, E, generator=g)
    t[SPECIAL] = 0.0
    return t


def _lm(output="continuous", **over):
    torch.manual_seed(0)
    task = TaskSpec(kind="mlm", vocab_size=V, max_seq_len=32, pad_id=0, num_labels=0, encoding="joint", head=None)
    m = build_student(_cfg(output, **over), task)
    set_input_vectors(m, _table())
    return m


def _batch(seed=0, lengths=(9, 6, 12)):
    g = torch.Generator().manual_seed(seed)
    rows = {"input_ids": [], "token_type_ids": [], "masked_positions": [], "masked_labels": [], "length": []}
    for n in lengths:
        ids = [2] + torch.randint(5, V, (n - 2,), generator=g).tolist() + [3]
        ids[3] = 1  # an [UNK] inside the text: context, never a target
        pos = [1, n - 2]
        rows["masked_labels"].append([ids[p] for p in pos])
        for p in pos:
            ids[p] = 4
        rows["input_ids"].append(ids)
        rows["token_type_ids"].append([0] * n)
        rows["masked_positions"].append(pos)
        rows["length"].append(n)
    batch, targets = collate(rows, kind="mlm", pad_id=0, labeled=True, pairs=False)
    return batch, targets


def _objective(model, batch):
    cfg = build(ObjectiveConfig, {"loss_weights": {"lm": 1.0}, "hidden_loss": "cosine", "layer_map": [-1, -1],
                                  "schedule": {"kind": "all_at_once", "warmup_fraction": 0.0, "temperature": 1.0,
                                               "temperature_decay": False}}, "objective")
    signals = SimpleNamespace(pool=1)  # the lm term reads no teacher signal
    return Objective(cfg, kind="mlm", signals=signals, dims=probe_student(model, batch))


def test_collate_undoes_the_static_masks():
    batch, _ = _batch()
    assert (batch["input_ids"] == 4).sum() == 6
    assert not (batch["unmasked_input_ids"] == 4).any()


@pytest.mark.parametrize("output", ["continuous", "adaptive", "subword"])
def test_lm_loss_equals_a_naive_loop(output):
    model = _lm(output).eval()
    batch, targets = _batch()
    out = model(batch)
    torch.set_grad_enabled(False)
    loss, parts = _objective(model, batch)(out, targets, multipliers={"lm": 1.0}, temperature=1.0)
    ids, mask = batch["unmasked_input_ids"], batch["attention_mask"]
    fw, bw = model.layers(ids, mask)
    table = _table()
    terms = []
    for b in range(ids.shape[0]):
        n = int(mask[b].sum())
        for t in range(1, n - 1):  # real tokens; [CLS] and [SEP] are context only
            tok = int(ids[b, t])
            if tok in SPECIAL:
                continue
            for state in (fw[-1][b, t - 1], bw[-1][b, t + 1]):  # forward LM from t-1, backward LM from t+1
                if output == "continuous":
                    c, w = model.mlm_head(state), table[tok]
                    terms.append(1 - float(c @ w) / (float(c.norm()) * float(w.norm())))  # eq. (2), cosine
                elif output == "subword":
                    logits = model.mlm_head(state)
                    terms.append(-(float(logits[tok]) - math.log(sum(math.exp(float(z)) for z in logits))))
                else:
                    terms.append(-float(model.mlm_head.log_prob(state[None])[0, tok]))
    assert len(terms) == 2 * sum(n - 3 for n in (9, 6, 12))  # minus [CLS], [SEP] and the [UNK]
    torch.set_grad_enabled(True)
    assert float(loss) == pytest.approx(sum(terms) / len(terms), rel=1e-5)


def test_continuous_cosine_equals_a_naive_loop():
    g = torch.Generator().manual_seed(1)
    pred, target = torch.randn(7, 4, generator=g), torch.randn(7, 4, generator=g)
    naive = sum(1 - sum(a * b for a, b in zip(p.tolist(), w.tolist())) /
                (math.sqrt(sum(a * a for a in p.tolist())) * math.sqrt(sum(b * b for b in w.tolist())))
                for p, w in zip(pred, target)) / 7
    assert float(losses.continuous_cosine(pred, target)) == pytest.approx(naive, rel=1e-6)


def test_forward_lm_never_sees_later_tokens_and_backward_never_earlier():
    model = _lm().eval()
    batch, _ = _batch()
    ids, mask = batch["unmasked_input_ids"], batch["attention_mask"]
    fw, bw = model.layers(ids, mask)
    t = 4
    later, earlier = ids.clone(), ids.clone()
    later[:, t + 1:] = torch.randint(5, V, later[:, t + 1:].shape)
    earlier[:, :t] = torch.randint(5, V, earlier[:, :t].shape)
    fw_l, bw_l = model.layers(later, mask)
    fw_e, bw_e = model.layers(earlier, mask)
    for j in range(2):
        assert torch.equal(fw_l[j][:, : t + 1], fw[j][:, : t + 1])
        assert torch.equal(bw_e[j][:, t:], bw[j][:, t:])
        assert not torch.equal(fw_e[j][:, t:], fw[j][:, t:])  # the test can fail: the forward LM does read <= t
        assert not torch.equal(bw_l[j][:, 1: t + 1], bw[j][:, 1: t + 1])


def _hand_count(output, e=E, H=12, P=5, n_layers=2, vocab=V, cutoffs=(10, 25), div=2.0):
    lstm = 0
    for j in range(n_layers):
        d_in = e if j == 0 else P
        lstm += 4 * H * d_in + 4 * H * P + 2 * 4 * H + P * H  # W_ih, W_hh, two biases, projection W_hr
        lstm += 2 * P  # LayerNorm after the projection
    encoder = 2 * lstm  # forward and backward LMs
    if output == "continuous":
        return encoder + P * e + e
    if output == "subword":
        return encoder + P * vocab + vocab
    edges = [0, *cutoffs, vocab]
    head = P * (cutoffs[0] + len(cutoffs))  # shortlist + one logit per tail cluster, no bias
    tails = sum(P * int(P // div ** (i + 1)) + int(P // div ** (i + 1)) * (edges[i + 2] - edges[i + 1])
                for i in range(len(cutoffs)))
    return encoder + head + tails


@pytest.mark.parametrize("output", ["continuous", "adaptive", "subword"])
def test_trainable_parameters_equal_a_hand_count(output):
    model = _lm(output)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == _hand_count(output)
    assert "input_vectors" in model.state_dict()  # the frozen table travels with the weights, as no parameter


def test_tune_head_trains_the_scalar_mix_and_head_and_leaves_the_lm_bit_identical():
    torch.manual_seed(0)
    head = build(HeadConfig, {"type": "mlp", "hidden_size": 8, "dropout": 0.0}, "head")
    task = TaskSpec(kind="classification", vocab_size=V, max_seq_len=32, pad_id=0, num_labels=2, encoding="diffcat",
                    head=head)
    model = build_student(_cfg(dropout=0.1), task)
    set_input_vectors(model, _table())
    trainable, total = freeze_for_tuning(model, "head")
    assert trainable == sum(p.numel() for n, p in model.named_parameters() if n.startswith("head."))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    g = torch.Generator().manual_seed(0)
    a = torch.randint(5, V, (4, 7), generator=g)
    b = torch.randint(5, V, (4, 5), generator=g)
    batch = {"a_input_ids": a, "a_attention_mask": torch.ones_like(a, dtype=torch.bool),
             "b_input_ids": b, "b_attention_mask": torch.ones_like(b, dtype=torch.bool)}
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(model(batch).logits, torch.tensor([0, 1, 0, 1]))
        loss.backward()
        opt.step()
        opt.zero_grad()
    after = model.state_dict()
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    assert {"head.mix.scalars", "head.mix.gamma"} <= changed
    assert changed and all(k.startswith("head.") for k in changed), sorted(changed)
