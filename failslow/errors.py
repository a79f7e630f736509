"""The project's exception root: every package's errors derive from FailslowError."""


class FailslowError(Exception):
    """Base of every error failslow raises on purpose (bad input, bad config, unreachable service)."""


class ConfigError(FailslowError):
    """A setting (flag or FAILSLOW_* variable) is missing or malformed."""
