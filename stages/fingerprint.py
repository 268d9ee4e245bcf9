"""DVC stage `fingerprint`: `python -m stages.fingerprint ...` runs `distillpipe fingerprint`
(see its `--help`).

It depends on the source folders themselves and writes fingerprints/, one file per stage script: the code deps of
every other stage (docs/code-deps.md).
"""

from distillpipe.commands.fingerprint import main

if __name__ == "__main__":
    main()
