"""DVC stage `prepare`: a thin wrapper over `distillpipe prepare` (see `distillpipe prepare --help`).

dvc.yaml is the one place that names paths; this script only forwards its arguments.
"""

import sys

from distillpipe.cli import app

if __name__ == "__main__":
    app(["prepare", *sys.argv[1:]], prog_name="stages/prepare.py")
