"""Teachers: loading (:mod:`.load`), signal capture through hooks (:mod:`.capture`), batching for
capture (:mod:`.batching`), the sequence pooling shared with the student losses (:mod:`.pooling`),
fine-tuning (:mod:`.finetune`) and the ``teacher_cache`` stage (:mod:`.shard` computes a shard,
:mod:`.cache` drives the store). This file imports nothing: import from the modules."""
