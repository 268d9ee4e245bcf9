"""DVC stage `augment`: `python -m stages.augment ...` runs `distillpipe augment`
(see its `--help`).

dvc.yaml names the paths and params.yaml holds the parameters; this script only imports the command's
module, so the stage's code deps are that command and the library it calls (tests/test_dvc_deps.py).
"""

from distillpipe.commands.augment import main

if __name__ == "__main__":
    main()
