"""What runs an exported student: PyTorch (the student module, as the evaluate stage runs it) or ONNX Runtime
(``model.onnx``). Both take a collated batch (torch tensors, masks bool; :func:`distillpipe.data.collate.collate`)
and return numpy arrays by output name: ``logits`` (B, C), or ``start_logits`` and ``end_logits`` (B, L)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from distillpipe.errors import UserError
from distillpipe.runtime import autocast

DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]
"""ONNX Runtime graph rewrites left out: slower than what they replace on the CPU (:class:`OnnxRunner`)."""


class RuntimeMissing(UserError, RuntimeError):
    """ONNX Runtime was asked for but is not installed."""


def parity(reference: dict[str, np.ndarray], other: dict[str, np.ndarray]) -> float:
    """Largest |other - reference| / max(1, |reference|) over every output."""
    worst = 0.0
    for name, ref in reference.items():
        diff = np.abs(other[name].astype(np.float64) - ref) / np.maximum(1.0, np.abs(ref))
        worst = max(worst, float(diff.max(initial=0.0)))
    return worst


@torch.inference_mode()
def torch_outputs(model: nn.Module, batch: dict[str, torch.Tensor], device: torch.device,
                  outs: list[str]) -> dict[str, np.ndarray]:
    """The student's outputs on a collated batch, as the evaluate stage computes them (autocast on CUDA)."""
    with autocast(device):
        out = model({k: v.to(device) for k, v in batch.items()})
    return {name: getattr(out, name).float().cpu().numpy() for name in outs}


class OnnxRunner:
    """ONNX Runtime on ``model.onnx``: collated batches (torch tensors, masks bool) in, numpy outputs out."""

    def __init__(self, path: Path, onnx_config: dict[str, Any], device: torch.device, threads: int | None = None):
        try:
            import onnxruntime as ort
        except ImportError as e:
            raise RuntimeMissing(f"--runtime onnx needs onnxruntime: pip install 'distillpipe[onnx]' ({e})") from None
        opts = ort.SessionOptions()
        opts.log_severity_level = 3  # errors only
        if threads:
            opts.intra_op_num_threads = threads
        providers = ["CPUExecutionProvider"]
        if device.type == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        # ORT fuses a residual Add with the LayerNormalization after it (SkipLayerNormalization); on the CPU that
        # kernel took 7% of MiniALBERT-128's time at batch 32, ~4x the two ops it replaces (measured 2026-11-28,
        # onnxruntime 1.32): with it ORT ran 0.98x PyTorch there, without it 1.04x (docs/use-your-student.md)
        self.session = ort.InferenceSession(str(path), sess_options=opts, providers=providers,
                                            disabled_optimizers=DISABLED_OPTIMIZERS if len(providers) == 1 else None)
        self.feeds = [i.name for i in self.session.get_inputs()]  # an input the graph does not read is dropped
        self.outputs = list(onnx_config["outputs"])
        self.multiple = int(onnx_config["length_multiple"])

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        lengths = {}
        feed = {}
        for name in self.feeds:
            t = batch[name]
            L = t.shape[1]
            lengths[name] = L
            pad = -L % self.multiple
            if pad:  # masked positions: the pad id is irrelevant, the mask says padding
                t = F.pad(t, (0, pad), value=0)
            feed[name] = t.long().numpy()
        out = dict(zip(self.outputs, self.session.run(self.outputs, feed)))
        if "start_logits" in out:  # (B, L') -> the batch's own length
            L = lengths.get("input_ids", next(iter(lengths.values())))
            out = {k: v[:, :L] for k, v in out.items()}
        return out


class TorchRunner:
    """The student module itself (what ``evaluate`` runs): collated batches in, numpy outputs out."""

    def __init__(self, model: nn.Module, device: torch.device, outputs: list[str]):
        self.model, self.device, self.outputs = model, device, list(outputs)

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        return torch_outputs(self.model, batch, self.device, self.outputs)
