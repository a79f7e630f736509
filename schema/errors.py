"""The project's exception root, at the bottom of the import graph so every package can
derive its errors from it without importing the command line (``failslow/``)."""


class FailslowError(Exception):
    """Base of every error failslow raises on purpose (bad input, bad config, unreachable service)."""
