"""Question generation for data augmentation (WaLDORf sec. 3.4: T5 fine-tuned context -> question,
then questions generated for Wikipedia paragraphs that are in no QA split; the teacher labels them).

Modules: ``vocab`` (SentencePiece vocabulary and T5 tokenizer), ``model`` (a T5 built from config or
a pretrained one; the input format), ``finetune`` (the ``qg_finetune`` stage), ``generate`` (batched,
length-sorted, seeded generation), ``filters`` (dropping bad questions), ``augment`` (the ``augment``
stage: paragraph selection and the chunked, resumable writer).
"""

from distillpipe.errors import UserError


class QgError(UserError, ValueError):
    """The QA data, the corpus, the generator or the params do not fit together; the message says how to fix it."""
