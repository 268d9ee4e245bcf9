"""The one base class of the errors a user can fix.

Library code raises a subclass with a message that says what went wrong, where, and how to fix it;
the command line (``distillpipe.commands.base``) prints that message and exits with status 2, without
a traceback (``DISTILLPIPE_DEBUG=1`` shows it). Anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """An error the user can fix; the message is the whole story."""
