"""The stand-in teacher (benchmarks/at_scale.py's): the capture takes it for the BERT shape it claims, its hooks give
what the capture would compute from those module outputs (an independent recomputation here), and a store built
with it through the real writer has exactly the layout of that shape."""

import numpy as np
import pytest
import torch

from distillpipe.pooling import avg_pool_seq, max_pool_scores
from distillpipe.store.constants import as_constants
from distillpipe.store.schema import SignalSpec
from distillpipe.teacher.capture import capture_batch, check_spec, embedding_constants, teacher_head
from distillpipe.teacher.standin import SHAPES, standin_teacher


def _spec(shape: str, task: str, L: int, **kw) -> SignalSpec:
    cfg = SHAPES[shape]
    fields = dict(max_seq_len=L, pool=4, task=task, n_classes=2 if task == "classification" else 0,
                  vocab_size=cfg["vocab_size"], mlm_topk=0, mlm_max_masked=0, hidden_layers=(), attn_layers=(),
                  hidden_size=cfg["hidden_size"], n_heads=cfg["num_attention_heads"], attn_probs_layers=(),
                  embedding_size=0)
    fields.update(kw)
    return SignalSpec(**fields)


def _batch(B: int, L: int, lengths: list[int]) -> dict:
    mask = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]
    return {"input_ids": torch.ones(B, L, dtype=torch.long), "token_type_ids": torch.zeros(B, L, dtype=torch.long),
            "attention_mask": mask.long()}


@pytest.mark.parametrize("head", ["base", "mlm", "classification", "qa"])
def test_the_capture_sees_the_claimed_shape(head):
    m = standin_teacher("bert-large", head, max_batch=4, max_seq_len=64, max_masked=8)
    assert teacher_head(m) == head and m.config.num_hidden_layers == 24
    task = head if head in ("classification", "qa") else "none"
    check_spec(m, _spec("bert-large", task, 64, hidden_layers=(24,), attn_layers=(12,),
                        mlm_topk=8 if head == "mlm" else 0, mlm_max_masked=8 if head == "mlm" else 0))
    with pytest.raises(ValueError, match="only 24 layers"):
        check_spec(m, _spec("bert-large", task, 64, hidden_layers=(25,)))
    # no weights but the embedding layer's tables: the encoder computes nothing
    assert sum(p.numel() for n, p in m.named_parameters() if "embeddings." not in n) == 1


def test_signals_are_the_capture_of_its_module_outputs():
    L, lengths = 32, [32, 20, 7]
    m = standin_teacher("bert-base", "base", max_batch=3, max_seq_len=L)
    spec = _spec("bert-base", "none", L, hidden_layers=(3,), attn_layers=(5,), embedding_size=768)
    tables, how = embedding_constants(m, 0)
    constants = as_constants(tables, {"embeddings": how}, spec)
    batch = _batch(3, L, lengths)
    out = capture_batch(m, batch, spec, constants=constants)  # the derived embedding output passes the check
    mask = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]
    layer = m.encoder.layer[4].attention.self
    h = m.encoder.layer[2].hidden.values[:3, :L]  # what layer 3 returns
    q = layer.query.bank.values[:3, :L] * 64 ** -0.5
    q, k = (t.view(3, L, 12, 64).transpose(1, 2) for t in (q, layer.key.bank.values[:3, :L]))
    scores = q @ k.transpose(2, 3)  # (B, H, L, L)
    np.testing.assert_allclose(out["hidden/L3"].float(), avg_pool_seq(h, mask, 4)[0].half().float())
    np.testing.assert_allclose(out["attn_scores/L5"].float(), max_pool_scores(scores, mask, 4)[0].half().float(),
                               rtol=1e-3, atol=1e-3)
    with torch.no_grad():
        emb = m.embeddings(batch["input_ids"], batch["token_type_ids"])
    torch.testing.assert_close(constants.embeddings(batch["input_ids"], batch["token_type_ids"], mask)[mask],
                               emb[mask], rtol=1e-5, atol=1e-5)


def test_a_store_built_with_it_has_the_shapes_layout(tmp_path):
    from datasets import Dataset

    from distillpipe.store.constants import load as load_constants
    from distillpipe.store.constants import write_constants
    from distillpipe.store.manifest import Manifest, TeacherInfo
    from distillpipe.store.reader import open_store
    from distillpipe.store.resume import create_or_resume
    from distillpipe.teacher.cache import producer_code, run_shards
    from distillpipe.teacher.fit import fit_constants
    from distillpipe.teacher.shard import compute_shard

    L, n = 48, 20
    lengths = np.random.default_rng(0).integers(10, L + 1, size=n).tolist()
    rows = Dataset.from_dict({"input_ids": [[101] + [1000] * (k - 2) + [102] for k in lengths],
                              "token_type_ids": [[0] * k for k in lengths], "length": lengths})
    spec = _spec("bert-large", "qa", L, hidden_layers=(6, 24), attn_layers=(12,), embedding_size=1024,
                 hidden_rank=128, hidden_fit_rows=8, attn_rank=8)
    m = standin_teacher("bert-large", "qa", max_batch=8, max_seq_len=L)
    manifest = Manifest(teacher=TeacherInfo(name="stand-in", weights_sha256="-", tokenizer_sha256="-", config={}),
                        tokens_fingerprint="t", split="train", signals=spec, compute={}, code=producer_code(),
                        n_rows=n, shard_rows=8)
    with create_or_resume(tmp_path / "s.zarr", manifest) as w:
        write_constants(tmp_path / "s.zarr", *fit_constants(m, rows, spec, 8, 0))
        constants = load_constants(tmp_path / "s.zarr", spec)
        run_shards(lambda i: compute_shard(m, rows, *manifest.shard_rows_range(i), spec, 8, 0, constants),
                   str(tmp_path / "s.zarr"), w.pending_shards(), lambda i, marker: w.record([i]), writers=2)
        w.finalize()
    st = open_store(tmp_path / "s.zarr")
    got = st.read(list(st.arrays), 0, n)
    assert {k: v.shape for k, v in got.items()} == {  # BERT-Large: d 1024 -> 128 coordinates, 16 heads of rank-8
        # factors; L 48 pooled 4x: 12; the embedding output derived, from the tables in the constants
        "row_index": (n,), "length": (n,), "start_logits": (n, L), "end_logits": (n, L),
        "hidden/L6": (n, 12, 128), "hidden/L24": (n, 12, 128), "attn_scores/L12/left": (n, 16, 8, 12),
        "attn_scores/L12/right": (n, 16, 8, 12)}
    arrays, _ = st.constants()
    assert arrays["constants/hidden/L6/basis"].shape == (1024, 128)
    assert arrays["constants/embeddings/word"].shape == (30522, 1024)
    assert got["length"].tolist() == lengths and got["row_index"].tolist() == list(range(n))
    assert st.info()["bytes_on_disk"] > 0
