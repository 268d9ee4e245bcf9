"""distillpipe: distil large pretrained language models into small, fast students."""
__version__ = "0.1.0"
