"""``make gpu-check``: the checks and measurements only a GPU can give, in one run (~9 minutes on one H100).

1. the CUDA-only tests (``pytest -m "" -k cuda``);
2. ``benchmarks/scale.py`` part 4: BERT-Large L 384 capture of 4 layers vs a bare forward, and vs ~3,200 seq/s;
3. ``benchmarks/at_scale.py`` on CUDA with a REAL random-weight BERT forward (task logits and WaLDORf
   signals on the BERT-Large shape): the whole teacher_cache path, build rows/s against the bare forward;
4. a one-GPU ``local_cuda`` dask build of a small store (dask-cuda), checked against an in-process build;
5. ``benchmarks/cached_vs_live.py`` on CUDA: a student's epoch from each seed's cache vs with the teacher live (the
   live path's equal targets on CUDA are among the tests of part 1: ``test_live_targets_equal_the_caches_on_cuda``).

Each part runs on its own, so one failing does not hide the others; the table at the end and
``$OUT/gpu_check.json`` (or ``benchmarks/results/gpu_check.json``) say what passed, what failed and why.
Run it where the GPU is: ``make gpu-check`` (DEVELOPERS.md: how to carry the packages the GPU machine lacks).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


F16 = {"hidden": "float16", "attention": "float16", "mlm_topk": "float16"}
INT8 = {"hidden": "int8", "attention": "int8", "mlm_topk": "float16"}


def run(cmd: list[str], timeout: int) -> tuple[int, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT / "src"), str(HERE), os.environ.get("PYTHONPATH", "")) if p)}
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    out = res.stdout + res.stderr
    print(out[-6000:])
    return res.returncode, out


def cuda_tests() -> dict:
    rc, out = run([sys.executable, "-m", "pytest", "-m", "", "-k", "cuda", "-q", "-rs", "-p", "no:cacheprovider"], 300)
    summary = [line for line in out.splitlines() if " passed" in line or " failed" in line or " error" in line]
    return {"ok": rc == 0, "summary": summary[-1] if summary else out[-300:]}


def scale_part4() -> dict:
    import scale

    return {"ok": True, **scale.bert_large_cuda()}


def at_scale(out_dir: Path) -> dict:
    path = out_dir / "at_scale_cuda.json"
    rc, out = run([sys.executable, str(HERE / "at_scale.py"), "--device", "cuda", "--teacher", "real", "--sets",
                   "logits,waldorf", "--rows", "2048", "--shard-rows", "512", "--disk-gb", "4", "--json", str(path)],
                  420)
    if rc:
        return {"ok": False, "error": out[-1000:]}
    data = json.loads(path.read_text())
    return {"ok": True, "sets": {f"{k} {variant}": {
        "build_rows_per_s": v[variant]["build_rows_per_s"], "bare_rows_per_s": v["bare_rows_per_s"],
        "build/bare": v[variant]["build_rows_per_s"] / v["bare_rows_per_s"],
        "bound": v[variant]["projection"]["per_disk"]["this disk"]["bound"],
        "writers_of_disk": v[variant]["writers_alone"]["of_disk"], "loader_of_disk": v[variant]["loader"]["of_disk"],
        "kib_per_row": v[variant]["stored_bytes_per_row"] / 1024,
        "epoch_vs_live": v[variant]["projection"]["per_disk"]["this disk"]["epoch"]["vs_live"]}
        for k, v in data["sets"].items() for variant in ("dense", "compact") if variant in v}}


def dask_cuda_build() -> dict:
    """A small store built on a local_cuda cluster (one worker, this GPU) equals one built in this process."""
    from datasets import Dataset, DatasetDict
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from distillpipe.assets import tokenizer_sha256
    from distillpipe.config.base import build
    from distillpipe.config.teacher_cache import TeacherCacheDatasetConfig
    from distillpipe.data.schema import write_meta
    from distillpipe.scale.machine import load_machine
    from distillpipe.store.reader import open_store
    from distillpipe.teacher.cache import build_teacher_cache

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        teacher = tmp / "teacher"
        torch.manual_seed(0)
        BertModel(BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                             vocab_size=1000)).save_pretrained(teacher)
        vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(995)]
        (tmp / "vocab.txt").write_text("\n".join(vocab) + "\n")
        BertTokenizerFast(vocab_file=str(tmp / "vocab.txt")).save_pretrained(teacher)
        lengths = torch.randint(16, 129, (2048,), generator=torch.Generator().manual_seed(0)).tolist()
        ids = [[2] + torch.randint(5, 1000, (k - 2,)).tolist() + [3] for k in lengths]
        tokens = tmp / "tokens"
        DatasetDict({"train": Dataset.from_dict({"input_ids": ids, "token_type_ids": [[0] * k for k in lengths],
                                                 "length": lengths})}).save_to_disk(str(tokens))
        write_meta(tokens, {"name": "gpu", "task_type": "corpus", "kind": "mlm", "fingerprint": "gpu-check",
                            "num_labels": 0, "label_names": None, "max_seq_len": 128, "params": {}, "summary": {},
                            "tokenizer": {"spec": str(teacher), "sha256": tokenizer_sha256(teacher), "pad_id": 0,
                                          "cls_id": 2, "sep_id": 3, "mask_id": 4, "vocab_size": 1000}})
        cfg = build(TeacherCacheDatasetConfig, {"teacher": "t", "head": "base", "split": "train", "max_rows": None,
                                                "signals": {"logits": False, "mlm_topk": 0, "hidden_layers": [2, 4],
                                                            "hidden_rank": 64, "hidden_fit_rows": 256,
                                                            "attn_layers": [2, 4], "attn_rank": 8, "pool": 4,
                                                            "attn_probs": False, "embeddings": True,
                                                            "precision": INT8}}, "gpu_check")
        t = time.perf_counter()
        build_teacher_cache("gpu", tokens, teacher, cfg, "cuda", 64, 256, tmp / "inproc.zarr", cpu_threads=1)
        inproc = time.perf_counter() - t
        (tmp / "machine.yaml").write_text("")
        cluster = load_machine({"DISTILLPIPE_MACHINE": str(tmp / "machine.yaml"),
                                "DISTILLPIPE_CLUSTER": "local_cuda"}).cluster
        t = time.perf_counter()
        build_teacher_cache("gpu", tokens, teacher, cfg, "cuda", 64, 256, tmp / "dask.zarr", cpu_threads=1,
                            cluster=cluster)
        dask = time.perf_counter() - t
        a, b = open_store(tmp / "inproc.zarr"), open_store(tmp / "dask.zarr")
        names = [n for n in a.arrays]
        same = all((a.read([n], 0, a.n_rows)[n] == b.read([n], 0, b.n_rows)[n]).all() for n in names)
        return {"ok": bool(same), "identical_arrays": bool(same), "inprocess_s": inproc, "local_cuda_s": dask}


def cached_vs_live() -> dict:
    rc, out = run([sys.executable, str(HERE / "cached_vs_live.py"), "--device", "cuda", "--rows", "512",
                   "--repeats", "2"], 300)
    ratios = [line.split()[3] for line in out.splitlines() if line.strip().startswith("live / cached")]
    return {"ok": rc == 0 and len(ratios) == 4, "live_over_cached": ratios}


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("gpu-check: no CUDA device here; run it on a GPU machine (DEVELOPERS.md)")
    out_dir = Path(os.environ.get("OUT") or HERE / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    parts = {"cuda tests": cuda_tests, "scale.py part 4": scale_part4, "at_scale.py (real forward)":
             lambda: at_scale(out_dir), "local_cuda dask build": dask_cuda_build,
             "cached_vs_live.py (live path)": cached_vs_live}
    for name, fn in parts.items():
        print(f"== {name}", flush=True)
        t = time.perf_counter()
        try:
            report[name] = fn()
        except Exception as e:  # noqa: BLE001 - one part failing must not hide the others
            report[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
        report[name]["seconds"] = round(time.perf_counter() - t, 1)
    (out_dir / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"\ngpu-check on {report['device']} ({report['date']}), torch {report['torch']}")
    print(f"{'part':32s} {'ok':>4s} {'s':>7s}  result")
    for name in parts:
        r = report[name]
        detail = {k: v for k, v in r.items() if k not in ("ok", "seconds")}
        shown = json.dumps(detail, default=str)[:300]
        print(f"{name:32s} {'yes' if r['ok'] else 'NO':>4s} {r['seconds']:7.1f}  {shown}")
    print(f"wrote {out_dir / 'gpu_check.json'}")
    if not all(report[name]["ok"] for name in parts):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
