"""Teachers: loading (:mod:`.load`), signal capture through hooks (:mod:`.capture`), batching for
capture (:mod:`.batching`) and the sequence pooling shared with the student losses (:mod:`.pooling`)."""

from distillpipe.teacher.batching import collate, length_buckets
from distillpipe.teacher.capture import CaptureRequest, capture_batch, signal_names, teacher_head, to_host
from distillpipe.teacher.load import load_teacher
from distillpipe.teacher.pooling import SCORE_MASKED, avg_pool_seq, max_pool_scores, pooled_mask

__all__ = ["SCORE_MASKED", "CaptureRequest", "avg_pool_seq", "capture_batch", "collate", "length_buckets",
           "load_teacher", "max_pool_scores", "pooled_mask", "signal_names", "teacher_head", "to_host"]
