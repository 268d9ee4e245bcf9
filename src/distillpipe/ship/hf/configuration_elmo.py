"""The configuration of an exported distillpipe ELMo student (ELMo-C, -A or -Sub under a task head), for
``transformers`` (``trust_remote_code``).

``config.json`` is distillpipe's own record of the student (``model``: the architecture's config; ``task``: kind,
head, vocabulary, pad id, DiffCat or joint encoding), with ``model_type``, ``auto_map`` and ``id2label`` added so
that the Auto classes and the text-classification pipeline load it.
"""

from transformers import PretrainedConfig


class ElmoConfig(PretrainedConfig):
    model_type = "distillpipe_elmo"

    def __init__(self, model=None, task=None, **kwargs):
        self.model = model or {}
        self.task = task or {}
        super().__init__(**kwargs)
