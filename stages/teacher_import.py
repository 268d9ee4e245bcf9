"""DVC stage `teacher_import`: a thin wrapper over `distillpipe teacher-import` (see `distillpipe teacher-import --help`).

dvc.yaml is the one place that names paths; this script only forwards its arguments.
"""

import sys

from distillpipe.cli import app

if __name__ == "__main__":
    app(["teacher-import", *sys.argv[1:]], prog_name="stages/teacher_import.py")
