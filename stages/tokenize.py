"""DVC stage `tokenize`: a thin wrapper over `distillpipe tokenize` (see `distillpipe tokenize --help`).

dvc.yaml is the one place that names paths; this script only forwards its arguments.
"""

import sys

from distillpipe.cli import app

if __name__ == "__main__":
    app(["tokenize", *sys.argv[1:]], prog_name="stages/tokenize.py")
