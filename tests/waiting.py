"""Wait for a condition with a deadline instead of sleeping a fixed time: fast when the
system is fast, and a clear failure (naming what was awaited) when it never happens."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(cond: Callable[[], T], timeout: float = 20.0, what: str = "condition",
               interval: float = 0.05) -> T:
    """Poll ``cond`` until it returns something truthy and return that; AssertionError
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
