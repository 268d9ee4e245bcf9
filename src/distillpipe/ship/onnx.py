"""``model.onnx``: the student's forward as an ONNX graph with dynamic batch and length axes, and ONNX Runtime.

The graph is traced (``torch.export``, then ``torch.onnx``) from the student module itself, wrapped only to take
its batch as named tensors. Inputs are int64 (B, L) arrays: ``input_ids``, ``token_type_ids``,
``attention_mask`` (1 = token, 0 = padding), or for DiffCat pairs ``a_input_ids``, ``a_attention_mask``,
``b_input_ids``, ``b_attention_mask``; outputs ``logits`` (B, C), or ``start_logits`` and ``end_logits`` (B, L).
Rows are right-padded. The CMOW/CBOW-Hybrid graph takes lengths that are multiples of
:data:`~distillpipe.students.cmow_hybrid.EXPORT_CHUNK` (its tree product has a fixed shape per chunk: see
students/cmow_hybrid.py); padding more is exact for it (padded positions are identities), and :class:`OnnxRunner`
pads. ``config.json``'s ``onnx`` entry names all of this.

Export checks itself: the graph must reproduce PyTorch within :data:`PARITY_TOLERANCE` on padded batches of
other shapes than the one it was traced with, or no ``model.onnx`` is written. Students that cannot export are
refused up front, with the reason (:func:`refusal`).
"""

from __future__ import annotations

import logging
import math
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from distillpipe.errors import UserError
from distillpipe.ship.runners import OnnxRunner, parity, torch_outputs
from distillpipe.students.base import TaskSpec
from distillpipe.students.cmow_hybrid import EXPORT_CHUNK

log = logging.getLogger(__name__)

PARITY_TOLERANCE = 1e-4
"""Largest difference allowed between ONNX Runtime's and PyTorch's outputs: |onnx - torch| / max(1, |torch|)."""

ELMO_REASON = (
    "ELMo's LSTMs have output projections (torch's proj_size; ELMo-C sec. 4.1: LSTM 4096 projected to 512), "
    "and ONNX's LSTM operator has none: torch.onnx writes them as plain LSTMs, which ONNX Runtime rejects "
    "(\"Input initial_c must have shape ...\"), and unrolling the recurrence would fix the length")
BILSTM_REASON = (
    "the bilstm head packs each row to its own length (pack_padded_sequence) before its LSTM, which torch.export "
    "cannot trace with a dynamic length")


class OnnxExportError(UserError, ValueError):
    """A student that cannot be exported to ONNX, or whose graph does not reproduce it."""


def refusal(student: str, head: str | None) -> str | None:
    """Why a student of this architecture with this task head (``linear``, ``mlp``, ``cnn``, ``bilstm``; None for
    QA) cannot be exported to ONNX, or None when it can."""
    if student == "elmo":
        return ELMO_REASON
    if head == "bilstm":
        return BILSTM_REASON
    return None


def head_type(task: TaskSpec) -> str | None:
    return task.head.type if task.head is not None else None


def input_names(task: TaskSpec) -> list[str]:
    if task.encoding == "diffcat":
        return ["a_input_ids", "a_attention_mask", "b_input_ids", "b_attention_mask"]
    return ["input_ids", "token_type_ids", "attention_mask"]


def output_names(task: TaskSpec) -> list[str]:
    return ["start_logits", "end_logits"] if task.kind == "qa" else ["logits"]


def length_multiple(student: str) -> int:
    """The multiple every sequence length of the graph must be (1: any length)."""
    return EXPORT_CHUNK if student == "cmow_hybrid" else 1


def _outputs(out, qa: bool) -> tuple[torch.Tensor, ...]:
    return (out.start_logits, out.end_logits) if qa else (out.logits,)


class _Joint(nn.Module):
    def __init__(self, student: nn.Module, qa: bool):
        super().__init__()
        self.student, self.qa = student, qa

    def forward(self, input_ids, token_type_ids, attention_mask):
        batch = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask.bool()}
        return _outputs(self.student(batch), self.qa)


class _DiffCat(nn.Module):
    def __init__(self, student: nn.Module, qa: bool):
        super().__init__()
        self.student, self.qa = student, qa

    def forward(self, a_input_ids, a_attention_mask, b_input_ids, b_attention_mask):
        batch = {"a_input_ids": a_input_ids, "a_attention_mask": a_attention_mask.bool(),
                 "b_input_ids": b_input_ids, "b_attention_mask": b_attention_mask.bool()}
        return _outputs(self.student(batch), self.qa)


def probe_batch(task: TaskSpec, lengths: list[int], seed: int) -> dict[str, torch.Tensor]:
    """A right-padded batch of random ids with rows of ``lengths`` (the first row the longest), as collate makes it
    (masks bool): what the parity check and the tracing run on."""
    g = torch.Generator().manual_seed(seed)
    L = max(lengths)

    def ids() -> torch.Tensor:
        x = torch.randint(0, task.vocab_size, (len(lengths), L), generator=g)
        return x.masked_fill(~mask, task.pad_id)

    mask = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]  # (B, L)
    if task.encoding == "diffcat":
        return {"a_input_ids": ids(), "a_attention_mask": mask, "b_input_ids": ids(), "b_attention_mask": mask}
    types = (torch.arange(L)[None, :] >= torch.tensor(lengths)[:, None] // 2) & mask  # a second segment
    return {"input_ids": ids(), "token_type_ids": types.long(), "attention_mask": mask}


def export_onnx(model: nn.Module, student: str, task: TaskSpec, path: Path) -> dict[str, Any]:
    """Write ``model`` (a student in eval mode, on the CPU) to ``path`` as ONNX; check it against PyTorch and return
    the ``onnx`` entry of config.json. Raises :class:`OnnxExportError` (naming why) when it cannot."""
    reason = refusal(student, head_type(task))
    if reason is not None:
        raise OnnxExportError(f"cannot export this {student} student to ONNX: {reason}. Export it without --onnx "
                              "and predict with the PyTorch runtime")
    try:
        import onnx
        import onnxscript  # noqa: F401  (torch.onnx translates with it)
    except ImportError as e:
        raise OnnxExportError(f"--onnx needs onnx and onnxscript: pip install -e '.[onnx]' ({e})") from None
    names, outs, multiple = input_names(task), output_names(task), length_multiple(student)
    graph = (_DiffCat if task.encoding == "diffcat" else _Joint)(model, task.kind == "qa").eval()
    chunks = math.ceil(task.max_seq_len / multiple)
    if chunks < 2:
        raise OnnxExportError(f"max length {task.max_seq_len} is too short to export a dynamic length "
                              f"(needs at least {2 * multiple})")
    # the traced example: 2 rows, one padded, long enough that no inner axis is 0 or 1 (torch.export would fix it)
    longest = 2 * multiple if multiple > 1 else min(task.max_seq_len, 19)
    example = probe_batch(task, [longest, longest // 2 + 1], seed=0)
    batch_dim = torch.export.Dim("batch", min=1)
    dims = {}
    for side in (("a_", "b_") if task.encoding == "diffcat" else ("",)):  # DiffCat: each sentence its own length
        if multiple > 1:
            length = multiple * torch.export.Dim(f"{side}chunks", min=1, max=chunks)
        else:
            length = torch.export.Dim(f"{side}length", min=1, max=task.max_seq_len)
        dims |= {n: {0: batch_dim, 1: length} for n in names if n.startswith(side)}
    args = tuple(example[n].long() for n in names)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exported = torch.export.export(graph, args, dynamic_shapes={n: dims[n] for n in names}, strict=False)
            program = torch.onnx.export(exported, input_names=names, output_names=outs, dynamo=True,
                                        optimize=True, verbose=False)
    except Exception as e:  # torch.export / torch.onnx raise many kinds: all mean "this graph cannot be exported"
        raise OnnxExportError(f"torch could not export this {student} student to ONNX ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:300]}); export it without --onnx") from e
    program.save(str(path), external_data=False)
    runner = OnnxRunner(path, {"inputs": names, "outputs": outs, "length_multiple": multiple}, torch.device("cpu"))
    worst = 0.0
    # other shapes than the traced one: one row; rows padded to lengths that are multiples of nothing
    for seed, lengths in enumerate(([task.max_seq_len // 3 + 1], [task.max_seq_len, 5, 1], [7, 3, 1])):
        batch = probe_batch(task, [min(n, task.max_seq_len) for n in lengths], seed=seed + 1)
        worst = max(worst, parity(torch_outputs(model, batch, torch.device("cpu"), outs), runner(batch)))
    if worst > PARITY_TOLERANCE:
        path.unlink()
        raise OnnxExportError(f"the ONNX graph of this {student} student differs from PyTorch by {worst:.2e} "
                              f"(more than {PARITY_TOLERANCE}) on padded batches: not written; export it without "
                              "--onnx")
    opset = next(o.version for o in onnx.load(str(path), load_external_data=False).opset_import if o.domain == "")
    log.info("ONNX graph of the %s student: opset %d, largest difference from PyTorch %.1e", student, opset, worst)
    return {"file": path.name, "inputs": names, "outputs": outs, "length_multiple": multiple,
            "max_length": chunks * multiple if multiple > 1 else task.max_seq_len, "opset": opset,
            "parity_max_difference": worst}
