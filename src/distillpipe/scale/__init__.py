"""Scaling out on existing engines: per-machine settings (:mod:`.machine`), dask.distributed clusters for
the teacher cache and augmentation (:mod:`.cluster`), torchrun for student training (:mod:`.ddp`).
This file imports nothing."""
