"""DVC stage `train_lm`: `python -m stages.train_lm ...` runs `distillpipe train-lm`
(see its `--help`).

dvc.yaml names the paths and params.yaml holds the parameters; this script only imports the command's
module, so the stage's code deps are that command and the library it calls (tests/test_dvc_deps.py).
"""

from distillpipe.commands.train_lm import main

if __name__ == "__main__":
    main()
