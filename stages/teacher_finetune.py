"""DVC stage `teacher_finetune`: a thin wrapper over `distillpipe teacher-finetune` (see `distillpipe teacher-finetune --help`).

dvc.yaml is the one place that names paths; this script only forwards its arguments.
"""

import sys

from distillpipe.cli import app

if __name__ == "__main__":
    app(["teacher-finetune", *sys.argv[1:]], prog_name="stages/teacher_finetune.py")
