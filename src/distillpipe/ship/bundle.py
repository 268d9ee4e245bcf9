"""The exported folder: what ``distillpipe export`` writes and what ``distillpipe predict`` loads.

```
<dir>/
  config.json          format and version; the student's architecture and config, its task (kind, labels, the
                       regression bin width, max length, the QA windowing and no-answer threshold), the tokenizer
                       it expects (sha256 of its files), the weights' sha256, the ONNX graph's inputs (if any)
  model.safetensors    the student's state dict (buffers included: ELMo's fixed input vectors)
  tokenizer.json, tokenizer_config.json, vocab.txt, ...   the tokenizer's files, as the tokens were made with
  model.onnx           with ``export --onnx``: the same forward, dynamic batch and length axes
  README.md            the model card (ship/card.py)
```

Loading rebuilds the student from its config with the pipeline's own classes (:func:`distillpipe.students.
student_from_record`) and checks every file against the digests in ``config.json``; it needs torch,
transformers and distillpipe, never DVC, Zarr or datasets.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from distillpipe.assets import tokenizer_files, tokenizer_sha256
from distillpipe.errors import UserError
from distillpipe.identity import sha256_file
from distillpipe.students import student_from_record

FORMAT = "distillpipe-student"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
ONNX_FILE = "model.onnx"
CARD_FILE = "README.md"


class BundleError(UserError, ValueError):
    """An exported folder that is incomplete, damaged, or of another format."""


def write_weights(folder: Path, model: torch.nn.Module) -> dict[str, str]:
    """``model.safetensors`` (every tensor its own copy: safetensors refuses shared storage); its file and sha256."""
    from safetensors.torch import save_file

    state = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": FORMAT})
    return {"file": WEIGHTS_FILE, "sha256": sha256_file(folder / WEIGHTS_FILE)}


def write_tokenizer(folder: Path, tokenizer_dir: Path, expected_sha256: str) -> list[str]:
    """Copy the tokenizer's files (those that decide tokenization, :func:`~distillpipe.assets.tokenizer_files`) and
    check that they are the ones the student's tokens were made with."""
    found = tokenizer_sha256(tokenizer_dir)
    if found != expected_sha256:
        raise BundleError(f"the tokenizer in {tokenizer_dir} (sha256 {found[:12]}...) is not the one the student's "
                          f"tokens were made with ({expected_sha256[:12]}...): point --tokenizer at that tokenizer")
    names = tokenizer_files(tokenizer_dir)
    for name in names:
        shutil.copyfile(tokenizer_dir / name, folder / name)
    return names


def write_config(folder: Path, config: dict[str, Any]) -> None:
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def read_config(folder: str | Path) -> dict[str, Any]:
    """``config.json`` of an exported folder, checked for format and version."""
    folder = Path(folder)
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise BundleError(f"{path} not found: {folder} is not an exported student (make one with "
                          "`distillpipe export <run> --out DIR`)")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise BundleError(f"{path} is not valid JSON ({e}): export the student again") from None
    if config.get("format") != FORMAT:
        raise BundleError(f"{path}: format {config.get('format')!r}, not {FORMAT!r}: not a distillpipe student")
    if config.get("format_version") != FORMAT_VERSION:
        raise BundleError(f"{path}: format version {config.get('format_version')}, this distillpipe reads "
                          f"{FORMAT_VERSION}: export the student again with this version")
    return config


def _check_file(folder: Path, name: str, sha256: str) -> Path:
    path = folder / name
    if not path.is_file():
        raise BundleError(f"{path} is missing: copy the whole exported folder, or export the student again")
    if sha256_file(path) != sha256:
        raise BundleError(f"{path} does not match the sha256 in {CONFIG_FILE}: the file was changed or damaged; "
                          "export the student again")
    return path


def load_model(folder: str | Path, device: torch.device) -> tuple[torch.nn.Module, dict[str, Any]]:
    """(the student in eval mode on ``device``, its config) from an exported folder."""
    from safetensors.torch import load_file

    folder = Path(folder)
    config = read_config(folder)
    weights = _check_file(folder, config["weights"]["file"], config["weights"]["sha256"])
    model, _, _ = student_from_record(config, folder / CONFIG_FILE)
    model.load_state_dict(load_file(str(weights)))
    return model.to(device).eval(), config


def load_tokenizer(folder: str | Path, config: dict[str, Any]) -> Any:
    """The fast tokenizer in an exported folder, checked against the digest in its config."""
    from transformers import AutoTokenizer, PretrainedConfig

    folder = Path(folder)
    if tokenizer_sha256(folder) != config["tokenizer"]["sha256"]:
        raise BundleError(f"the tokenizer files in {folder} do not match the sha256 in {CONFIG_FILE}: they were "
                          "changed or damaged; export the student again")
    # a bare config: the folder's own (config.json, with an auto_map for transformers) would make AutoTokenizer ask
    # whether to trust the folder's code; the tokenizer's class is named by tokenizer_config.json
    tok = AutoTokenizer.from_pretrained(str(folder), config=PretrainedConfig())
    if not tok.is_fast:
        raise BundleError(f"{folder}: the tokenizer loads as a slow one; predict needs its tokenizer.json")
    return tok
