"""Signal capture on tiny random teachers of each architecture family, against the model's own eager outputs
(``output_hidden_states``, ``output_attentions``, logits) at float16 storage's tolerance; each signal an
architecture cannot give is refused exactly, in one line naming the architecture and the signal."""

import pytest
import torch
from _arch_tiny import LAYERS, tiny_model
from _teacher_tiny import make_rows, spec_for

from distillpipe.teacher.arch import ArchitectureError, mlm_logits, model_inputs, refusal
from distillpipe.teacher.batching import collate
from distillpipe.teacher.capture import capture_batch

F16 = dict(rtol=2e-3, atol=2e-3)  # float16 storage of O(1) values
ALL = tuple(range(0, LAYERS + 1))
ATTENTION = ("bert", "roberta", "electra", "electra_small", "distilbert")  # Q K^T of the projections is exact
EVERY = (*ATTENTION, "deberta_v2", "modernbert")
_MODELS: dict = {}


def model(family, head="base"):
    if (family, head) not in _MODELS:
        _MODELS[family, head] = tiny_model(family, head, seed=len(_MODELS))
    return _MODELS[family, head]


def batch_for(family, n_masked=None):
    pad = 1 if family == "roberta" else 0  # RoBERTa's pad id; every row id is >= 2, none a pad
    return collate(make_rows([13, 9, 5, 2], n_masked=n_masked), pad_id=pad)


def eager(m, batch):
    inputs = model_inputs(m, {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")})
    with torch.no_grad():
        return m(**inputs, output_hidden_states=True, output_attentions=True)


@pytest.mark.parametrize("family", EVERY)
def test_hidden_states_equal_output_hidden_states(family):
    m, batch = model(family), batch_for(family)
    out = capture_batch(m, batch, spec_for(m, hidden_layers=ALL))
    ref = eager(m, batch)
    real = batch["attention_mask"].bool()
    assert len(ref.hidden_states) == LAYERS + 1
    for j in ALL:  # ELECTRA-small's L0 is the projected embedding output; ModernBERT's last is after final_norm
        got = out[f"hidden/L{j}"].float()
        assert got.shape == ref.hidden_states[j].shape, j
        torch.testing.assert_close(got[real], ref.hidden_states[j][real], **F16)


@pytest.mark.parametrize("family", EVERY)
@pytest.mark.parametrize("head", ["classification", "qa"])
def test_task_logits_equal_the_models_own(family, head):
    m, batch = model(family, head), batch_for(family)
    out = capture_batch(m, batch, spec_for(m, task=head, hidden_layers=(LAYERS,)))
    ref = eager(m, batch)
    if head == "qa":
        real = batch["attention_mask"].bool()
        torch.testing.assert_close(out["start_logits"].float()[real], ref.start_logits[real], **F16)
        torch.testing.assert_close(out["end_logits"].float()[real], ref.end_logits[real], **F16)
    else:
        torch.testing.assert_close(out["logits"].float(), ref.logits, **F16)


@pytest.mark.parametrize("family", EVERY)
def test_mlm_topk_are_the_heads_own_logits_at_the_masked_positions(family):
    m = model(family, "mlm")
    batch = batch_for(family, n_masked=[3, 2, 1, 0])
    out = capture_batch(m, batch, spec_for(m, mlm_topk=5))
    logits = eager(m, batch).logits  # (B, L, V): the *ForMaskedLM forward itself
    pos, valid = batch["masked_positions"], batch["masked_valid"]
    full = logits.gather(1, pos[..., None].expand(-1, -1, logits.shape[-1]))  # (B, M, V)
    top, ids = full.topk(5, dim=-1)
    torch.testing.assert_close(out["mlm/topk_logits"].float()[valid], top[valid], **F16)
    assert torch.equal(out["mlm/topk_ids"][valid].long(), ids[valid])
    torch.testing.assert_close(out["mlm/logsumexp"][valid], torch.logsumexp(full, -1)[valid], rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # the head alone, as mlm_head.py trains it
        torch.testing.assert_close(mlm_logits(m, m.base_model(**model_inputs(m, {
            k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")})).last_hidden_state), logits)


@pytest.mark.parametrize("family", ATTENTION)
def test_attention_scores_and_probs_equal_output_attentions(family):
    m, batch = model(family), batch_for(family)
    layers = tuple(range(1, LAYERS + 1))
    scores = capture_batch(m, batch, spec_for(m, attn_layers=layers))
    probs = capture_batch(m, batch, spec_for(m, attn_probs_layers=layers))
    ref = eager(m, batch)
    q_valid = batch["attention_mask"].bool()[:, None, :, None]
    for j in layers:
        want = ref.attentions[j - 1].masked_fill(~q_valid, 0)
        got = torch.softmax(scores[f"attn_scores/L{j}"].float(), dim=-1).masked_fill(~q_valid, 0)  # -inf keys -> 0
        torch.testing.assert_close(got, want, **F16)
        torch.testing.assert_close(probs[f"attn_probs/L{j}"].float(), want, rtol=2e-3, atol=1e-3)


@pytest.mark.parametrize("family", ["bert", "roberta", "electra", "distilbert", "deberta_v2", "modernbert"])
def test_derived_embeddings_equal_the_embedding_output(family):
    from _teacher_tiny import constants_for

    m, batch = model(family), batch_for(family)
    spec = spec_for(m, embeddings=True)
    pad = 1 if family == "roberta" else 0
    from distillpipe.store.constants import as_constants
    from distillpipe.teacher.fit import fit_constants

    arrays, info = fit_constants(m, None, spec, batch_size=4, pad_id=pad)
    constants = as_constants(arrays, info, spec)
    capture_batch(m, batch, spec, constants=constants)  # checks derived == the module's own on every batch
    derived = constants.embeddings(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"].bool())
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(derived[real], eager(m, batch).hidden_states[0][real], **F16)
    assert constants_for  # the helper the other capture tests use builds the same constants


@pytest.mark.parametrize("family, signal, what", [
    ("deberta_v2", "attn_scores", "disentangled attention"), ("deberta_v2", "attn_probs", "disentangled attention"),
    ("modernbert", "attn_scores", "rotary"), ("modernbert", "attn_probs", "rotary"),
    ("electra_small", "embeddings", "16 wide"),
])
def test_a_signal_the_architecture_cannot_give_is_refused_in_one_line(family, signal, what):
    m, batch = model(family), batch_for(family)
    sel = {"attn_scores": dict(attn_layers=(1,)), "attn_probs": dict(attn_probs_layers=(1,)),
           "embeddings": dict(embeddings=True)}[signal]
    with pytest.raises(ArchitectureError) as e:
        capture_batch(m, batch, spec_for(m, hidden_layers=(1,), **sel))
    msg = str(e.value)
    name = {"deberta_v2": "DeBERTa-v2/v3", "modernbert": "ModernBERT", "electra_small": "ELECTRA"}[family]
    assert "\n" not in msg and f"{name} teacher cannot give {signal}" in msg and what in msg, msg
    assert "Nearest signal set that works: {hidden}" in msg, msg
    assert refusal(m.config, ["hidden", signal], "x") == f"x: {msg.split(': ', 1)[1]}"  # config alone decides


def test_an_unknown_architecture_is_refused_naming_it():
    assert "'gpt2'" in refusal({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, ["hidden"], "plan")


@pytest.mark.parametrize("family", EVERY)
def test_an_mlm_head_is_added_to_a_headless_checkpoint_and_only_it_trains(family, tmp_path):
    from _tiny import make_mlm_tokens
    from datasets import load_from_disk

    from distillpipe.teacher.mlm_head import build_mlm_model, mlm_loss

    folder = tmp_path / "base"
    model(family).save_pretrained(folder)  # the encoder alone (AutoModel): no MLM head
    (folder / "vocab.txt").write_text("\n".join(f"t{i}" for i in range(100)) + "\n")  # tokens_meta digests it
    rows = load_from_disk(str(make_mlm_tokens(tmp_path / "tokens", folder, n_rows=32, repeat=True)))["train"][:32]
    torch.manual_seed(0)
    mlm, is_new = build_mlm_model(folder)
    assert is_new
    frozen = {k: v.clone() for k, v in mlm.base_model.state_dict().items()}
    trainable = [p for p in mlm.parameters() if p.requires_grad]
    assert trainable and all(not p.requires_grad for p in mlm.base_model.parameters())
    opt = torch.optim.Adam(trainable, lr=1e-2)
    pad = 1 if family == "roberta" else 0
    losses = []
    for _ in range(15):
        loss = mlm_loss(mlm.train(), rows, pad, torch.device("cpu"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0] - 0.1, losses  # the head trains: the loss falls with the encoder frozen
    for k, v in mlm.base_model.state_dict().items():
        assert torch.equal(v, frozen[k]), f"{k} changed: the encoder must stay frozen"


def test_mlm_head_of_an_unknown_architecture_is_refused_naming_it():
    class Other(torch.nn.Module):
        config = type("C", (), {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})()

    with pytest.raises(ArchitectureError, match="'gpt2'"):
        mlm_logits(Other(), torch.zeros(1, 4))


def test_deberta_with_a_convolution_hidden_states_equal_output_hidden_states():
    m = tiny_model("deberta_v2", conv_kernel_size=3, conv_act="gelu")  # layer 1's output goes through encoder.conv
    assert m.encoder.conv is not None
    batch = batch_for("deberta_v2")
    out = capture_batch(m, batch, spec_for(m, hidden_layers=(1, 2)))
    ref = eager(m, batch)
    real = batch["attention_mask"].bool()
    for j in (1, 2):
        torch.testing.assert_close(out[f"hidden/L{j}"].float()[real], ref.hidden_states[j][real], **F16)
