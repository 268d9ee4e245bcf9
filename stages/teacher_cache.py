"""DVC stage `teacher_cache`: `python -m stages.teacher_cache ...` runs `distillpipe teacher-cache`
(see its `--help`).

dvc.yaml names the paths and params.yaml holds the parameters; this script only imports the command's
module, so the stage's code deps are that command and the library it calls (tests/test_dvc_deps.py).
"""

from distillpipe.commands.teacher_cache import main

if __name__ == "__main__":
    main()
