"""Errors of the command line; the project's root error lives in ``schema.errors`` (the
bottom of the import graph) and is re-exported here."""

from failslow.schema.errors import FailslowError

__all__ = ["ConfigError", "FailslowError"]


class ConfigError(FailslowError):
    """A setting (flag or FAILSLOW_* variable) is missing or malformed."""
