"""The teacher-cache store: sharded, resumable Zarr v3 groups of cached teacher outputs.

The only package that imports zarr. Import from the modules themselves (this file imports nothing, so a
stage that reads stores does not depend on the writer's code, and vice versa):
  schema    SignalSpec and the array layout it implies (names, shapes, chunks, shards, dtypes, codecs)
  manifest  Manifest (identity + progress), comparison, ManifestMismatch, StoreIncomplete, StoreDamaged
  shards    per-shard files and completion markers (what makes resume and parallel writes safe)
  lock      the one-writer-per-store lock (an OS file lock beside the store, owner recorded)
  writer    create_or_resume, StoreWriter, write_shard (self-contained, for worker processes)
  reader    open_store, TeacherStore, format_info
  loader    BlockLoader / BlockDataset (imports torch)
"""
