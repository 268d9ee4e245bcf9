"""The teacher-cache store: sharded, resumable Zarr v3 groups of cached teacher outputs.

The only package that imports zarr. Modules:
  schema    SignalSpec and the array layout it implies (names, shapes, chunks, shards, dtypes)
  manifest  Manifest (identity + progress), comparison, ManifestMismatch, StoreIncomplete
  shards    per-shard files and completion markers (what makes resume and parallel writes safe)
  writer    create_or_resume, StoreWriter, write_shard (self-contained, for worker processes)
  reader    open_store, TeacherStore, format_info
  loader    BlockLoader / BlockDataset (imports torch; import it from distillpipe.store.loader)
"""

from distillpipe.store.manifest import (
    FORMAT_VERSION,
    FieldDiff,
    Manifest,
    ManifestMismatch,
    StoreIncomplete,
    TeacherInfo,
    check_manifest,
    diff_manifests,
)
from distillpipe.store.reader import TeacherStore, format_info, open_store
from distillpipe.store.schema import ATTN_MASKED, MLM_UNUSED_POSITION, ArraySpec, SignalSpec, array_layout
from distillpipe.store.writer import StoreSummary, StoreWriter, create_or_resume, write_shard

__all__ = [
    "ATTN_MASKED",
    "FORMAT_VERSION",
    "MLM_UNUSED_POSITION",
    "ArraySpec",
    "FieldDiff",
    "Manifest",
    "ManifestMismatch",
    "SignalSpec",
    "StoreIncomplete",
    "StoreSummary",
    "StoreWriter",
    "TeacherInfo",
    "TeacherStore",
    "array_layout",
    "check_manifest",
    "create_or_resume",
    "diff_manifests",
    "format_info",
    "open_store",
    "write_shard",
]
