"""Parse FAILSLOW_CLICKHOUSE URLs: ``chdb:///folder[?database=db]`` and
``clickhouse://user:password@host:9000/db``; ``clickhouses://`` or ``?secure=1`` for TLS
(default port 9440), ``?ca_certs=FILE`` and ``?verify=0``, ``?password=`` (the entry
point folds FAILSLOW_CLICKHOUSE_PASSWORD[_FILE] in there).

>>> mask("clickhouse://u:hunter2@h:9000/db?password=x&secure=1")
'clickhouse://u:***@h:9000/db?password=***&secure=1'
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from failslow.storage.errors import StorageError

DEFAULT_DATABASE = "failslow"
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_identifier(name: str) -> str:
    """A database/table name we splice into SQL: letters, digits, underscore only."""
    if not _IDENT.match(name):
        raise StorageError(f"bad ClickHouse identifier {name!r} (letters, digits, _ only)")
    return name


@dataclass(frozen=True)
class ClickHouseURL:
    scheme: str  # "chdb" or "clickhouse"
    database: str
    path: Path | None = None  # chdb data folder
    host: str = "127.0.0.1"
    port: int = 9000
    user: str = "default"
    password: str = field(default="", repr=False)
    secure: bool = False
    ca_certs: str | None = None
    verify: bool = True

    def redacted(self) -> str:
        """The URL with the password hidden, for logs and messages."""
        if self.scheme == "chdb":
            return f"chdb://{self.path}?database={self.database}"
        auth = f"{self.user}:***@" if self.password else f"{self.user}@"
        scheme = "clickhouses" if self.secure else "clickhouse"
        return f"{scheme}://{auth}{self.host}:{self.port}/{self.database}"


_SECRET_IN_URL = re.compile(r"(?P<pre>://[^/@:?#]*:)[^@/?#]*(?=@)|(?P<q>[?&]password=)[^&#]*")


def mask(text: str) -> str:
    """``text`` with every URL password (user:PASSWORD@, ?password=) replaced by ***; safe
    on malformed URLs, so error messages can quote what the user typed."""
    return _SECRET_IN_URL.sub(lambda m: (m.group("pre") or m.group("q")) + "***", text)


def _flag(query: dict[str, list[str]], name: str, default: bool) -> bool:
    value = query.get(name, [None])[0]
    if value is None:
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def parse(url: str) -> ClickHouseURL:
    """Split a ClickHouse URL into its parts; StorageError names what is wrong."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    if parts.scheme == "chdb":
        folder = unquote(parts.netloc + parts.path)
        if not folder:
            raise StorageError(f"chdb URL needs a folder: chdb:///path/to/folder, got {mask(url)!r}")
        database = query.get("database", [DEFAULT_DATABASE])[0]
        return ClickHouseURL("chdb", check_identifier(database),
                             path=Path(folder).expanduser().resolve())
    if parts.scheme in ("clickhouse", "clickhouse+native", "clickhouses"):
        secure = parts.scheme == "clickhouses" or _flag(query, "secure", False)
        try:
            port = parts.port or (9440 if secure else 9000)
        except ValueError:
            raise StorageError(f"bad port in ClickHouse URL {mask(url)!r}") from None
        database = parts.path.strip("/") or DEFAULT_DATABASE
        password = query["password"][0] if "password" in query else unquote(parts.password or "")
        return ClickHouseURL(
            "clickhouse", check_identifier(database), host=parts.hostname or "127.0.0.1",
            port=port, user=unquote(parts.username or "default"), password=password,
            secure=secure, ca_certs=query.get("ca_certs", [None])[0],
            verify=_flag(query, "verify", True))
    raise StorageError(
        f"unknown ClickHouse URL scheme {parts.scheme!r}: use chdb:///folder, "
        "clickhouse://user@host:9000/db or clickhouses://user@host:9440/db (TLS)")
