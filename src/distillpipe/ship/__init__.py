"""Students that ship: a trained student exported as a self-contained folder, and predictions from it.

  bundle   the exported folder's format: safetensors weights, ``config.json``, the tokenizer's files; writing it
           and loading it back (needs torch, transformers and distillpipe, never DVC, Zarr or datasets)
  runners  what runs an exported student: the PyTorch module (as evaluate runs it) or ONNX Runtime
  onnx     ``model.onnx`` with dynamic batch and length axes, its parity check against PyTorch; what cannot export
  rows     input bytes -> rows: a row is a line as ``wc -l`` counts it, whatever bytes it holds
  predict  raw text (lines, TSV, stdin) -> the tokenize stage's rows -> batched forward -> JSON records
  card     the generated model card (``README.md``) from the run's records
  card_meta  its YAML front matter in the Hub's conventions (license, base model, model-index of every score)
  export   ``distillpipe export``: a run's student, records and tokenizer into a folder

The exported model runs the student's own forward (the module the pipeline trained and evaluated, rebuilt from its
config), on rows encoded by the tokenize stage's own functions, post-processed by the evaluate stage's own code:
its predictions are the pipeline's (tests/ship/test_ship_predict_equals_evaluate.py).
"""
