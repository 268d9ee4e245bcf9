"""The real embedded teacher (MiniLM-L6-H384, no MLM head): capture agrees with its own outputs."""

import pytest
import torch
from _teacher_tiny import live_forward, spec_for

from distillpipe.assets import AssetError
from distillpipe.pooling import avg_pool_seq, max_pool_scores
from distillpipe.teacher.batching import collate
from distillpipe.teacher.capture import capture_batch
from distillpipe.teacher.load import load_teacher

SENTENCES = ["The cat sat on the mat.",
             "Distillation compresses a large teacher into a small, fast student model for reading comprehension.",
             "Short one."]


@pytest.fixture(scope="module")
def minilm():
    return load_teacher("embedded:minilm-l6", "base", "cpu")


def test_minilm_capture_matches_its_outputs(minilm):
    model, tok = minilm
    assert model.config.num_hidden_layers == 6 and model.config.num_attention_heads == 12
    enc = [tok(s) for s in SENTENCES]
    rows = [{"input_ids": e["input_ids"], "token_type_ids": e["token_type_ids"], "length": len(e["input_ids"])}
            for e in enc]
    batch = collate(rows, pad_id=tok.pad_token_id)
    spec = spec_for(model, hidden_layers=(2, 4, 6), attn_layers=(2, 4, 6), attn_probs_layers=(6,), pool=4)
    out = capture_batch(model, batch, spec)
    # The reference: the same weights under eager attention, whose output_attentions are the truth.
    from transformers import BertModel

    from distillpipe.assets import resolve_model

    eager = BertModel.from_pretrained(resolve_model("embedded:minilm-l6"), attn_implementation="eager").eval()
    assert model.config._attn_implementation == "sdpa"
    live = live_forward(eager, batch)
    mask = batch["attention_mask"].bool()
    for j in (2, 4, 6):
        ref_h, valid = avg_pool_seq(live.hidden_states[j], mask, 4)
        torch.testing.assert_close(out[f"hidden/L{j}"].float(), ref_h, rtol=2e-3, atol=2e-3)
        blocks = (valid[:, :, None] & valid[:, None, :])[:, None].expand(-1, 12, -1, -1)  # (B, H, n, n)
        assert torch.equal(torch.isfinite(out[f"attn_scores/L{j}"]), blocks)  # -inf exactly on empty blocks
    q_valid = mask[:, None, :, None]
    torch.testing.assert_close(out["attn_probs/L6"].float(), live.attentions[5].masked_fill(~q_valid, 0),
                               rtol=2e-3, atol=1e-3)
    full = capture_batch(model, batch, spec_for(model, attn_layers=(6,)))
    probs = torch.softmax(full["attn_scores/L6"].float(), dim=-1).masked_fill(~q_valid, 0)
    torch.testing.assert_close(probs, live.attentions[5].masked_fill(~q_valid, 0), rtol=2e-3, atol=1e-3)
    pooled = max_pool_scores(full["attn_scores/L6"].float(), mask, 4)[0]
    torch.testing.assert_close(pooled, out["attn_scores/L6"].float())


def test_minilm_has_no_mlm_head():
    with pytest.raises(AssetError, match="no MLM head"):
        load_teacher("embedded:minilm-l6", "mlm", "cpu")
