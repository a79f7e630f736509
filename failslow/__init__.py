"""failslow: finds fail-slows (stragglers) in large GPU training jobs."""


def step() -> None:
    """Mark the end of one training step and the start of the next, for the hook that
    ``failslow run`` / ``FAILSLOW_TRACE_DIR`` installs (use it when the optimizer's
    ``step()`` does not tell where steps end). Does nothing when no hook is active."""
    from failslow.collectors.autohook import active

    auto = active()
    if auto is not None:
        auto.marker()
