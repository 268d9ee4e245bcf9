"""The configuration of an exported distillpipe CMOWHybrid student, for ``transformers`` (``trust_remote_code``).

``config.json`` is distillpipe's own record of the student (``model``: the architecture's config; ``task``: kind,
head, vocabulary, pad id, DiffCat or joint encoding; ``qa``: windowing and the no-answer threshold), with
``model_type``, ``auto_map`` and ``id2label`` added so that the Auto classes and pipelines load it.
"""

from transformers import PretrainedConfig


class CMOWHybridConfig(PretrainedConfig):
    model_type = "distillpipe_cmow_hybrid"

    def __init__(self, model=None, task=None, **kwargs):
        self.model = model or {}
        self.task = task or {}
        super().__init__(**kwargs)
