"""The command line, one module per command: each defines the command function and ``main`` (what the
DVC stage script runs). ``distillpipe.cli`` gathers them into the ``distillpipe`` command.

A stage script imports only its own command module, so its import closure (and its DVC code deps) is
that command and the library it calls, never the other stages' code. This file imports nothing.
"""
