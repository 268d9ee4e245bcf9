"""DVC stage `word_vectors`: `python -m stages.word_vectors ...` runs `distillpipe word-vectors`
(see its `--help`).

dvc.yaml names the paths and params.yaml holds the parameters; this script only imports the command's
module, so the stage's code deps are that command and the library it calls (tests/test_dvc_deps.py).
"""

from distillpipe.commands.word_vectors import main

if __name__ == "__main__":
    main()
