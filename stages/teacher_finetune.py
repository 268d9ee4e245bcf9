"""DVC stage `teacher_finetune`: a thin wrapper over `distillpipe teacher-finetune`
(see `distillpipe teacher-finetune --help`).

dvc.yaml is the one place that names paths; this script only forwards its arguments.
"""

import sys
from pathlib import Path

# Drop this folder from the import path: stages/tokenize.py would shadow the stdlib `tokenize`.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from distillpipe.cli import app  # noqa: E402

if __name__ == "__main__":
    app(["teacher-finetune", *sys.argv[1:]], prog_name="stages/teacher_finetune.py")
