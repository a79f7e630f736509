"""Keep secrets out of log lines: every value registered here (passwords, routing keys,
webhook URLs, resolved by ``failslow.config.resolve``) is replaced by ``***`` in each log
record's message, whatever logger or library wrote it, and URL passwords are masked.

>>> import logging
>>> register("hunter2")
>>> install()
>>> logging.getLogger("x").makeRecord("x", 30, "f", 1, "pw=%s", ("hunter2",), None).getMessage()
'pw=***'
"""

from __future__ import annotations

import logging

from failslow.storage.url import mask

_SECRETS: set[str] = set()
_installed: list[bool] = []


def register(*values: str | None) -> None:
    """Mask these values (at least 4 characters; shorter ones would mask ordinary text)."""
    _SECRETS.update(v for v in values if v and len(v) >= 4)


def scrub(text: str) -> str:
    for secret in sorted(_SECRETS, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, "***")
    return mask(text) if "://" in text else text


def install() -> None:
    """Wrap the log record factory once per process."""
    if _installed:
        return
    _installed.append(True)
    base = logging.getLogRecordFactory()

    def factory(*args, **kwargs):  # type: ignore[no-untyped-def]
        record = base(*args, **kwargs)
        if _SECRETS or "://" in str(record.msg):
            try:
                message = record.getMessage()
            except Exception:  # noqa: BLE001 - a bad format string is logging's to report
                return record
            clean = scrub(message)
            if clean != message:
                record.msg, record.args = clean, ()
        return record

    logging.setLogRecordFactory(factory)
