"""One error type for everything a user can get wrong.

The CLI turns a ``HydraEdgeError`` into one line on stderr and a non-zero exit; anything else
is a bug and keeps its traceback.
"""


class HydraEdgeError(Exception):
    """A user-facing error: the message says what went wrong, where, and how to fix it."""


class CheckpointError(HydraEdgeError):
    """A file is not a checkpoint this toolkit can load into the requested model."""
