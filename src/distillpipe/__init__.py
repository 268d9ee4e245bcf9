"""distillpipe: distil large pretrained language models into small, fast students.

The package graph runs downwards: a package (or top-level module) imports only from the layers below
its own, never from its own layer's siblings or from above, and always at module level (no function-local
imports that would hide an edge). ``tests/test_layers.py`` checks every import against :data:`LAYERS`.
"""

__version__ = "0.1.0"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors",),            # UserError and what a full disk looks like: every layer may raise them
    ("identity", "progress", "runtime", "checkpoints", "pooling", "compact", "tracking"),  # plain helpers
    ("config",),            # params.yaml sections as dataclasses
    ("assets",),            # where models, tokenizers and packaged data come from
    ("store",),             # the teacher cache's on-disk format: schema, manifest, writer, reader, loader
    ("data",),              # sources, prepare, tokenize, batching and collation, word vectors
    ("scale",),             # dask clusters, torchrun/DDP
    ("students", "losses"),  # the student networks; the loss functions (paper equations)
    ("teacher",),           # loading a teacher, capturing its signals, building the cache
    ("evaluate", "qg"),     # scoring teachers and students, speed, report; question generation
    ("train",),             # training loops: students (distillation, fine-tuning), teacher fine-tuning
    ("ship",),              # exported students: the folder, ONNX, predict, the model card
    ("scaffold",),          # `distillpipe new-task`: params.yaml entries for a new task
    ("fingerprints",),      # the stages' code fingerprints: the code deps of dvc.yaml
    ("commands",),          # one module per CLI command / DVC stage
    ("cli",),
)
"""Layers from the bottom up; the names are the subpackages and modules of ``distillpipe``."""
