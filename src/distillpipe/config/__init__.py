"""Typed pipeline configuration: one module per ``params.yaml`` section, one frozen dataclass per section.

A stage imports only the modules of the sections it reads (``distillpipe.config.teacher_cache``...), so
an edit to one section's schema re-runs only the stages that read it (dvc.yaml's deps are the import
closure). The strict loader is :mod:`distillpipe.config.base`. This file imports nothing on purpose.
"""
