"""Parse FAILSLOW_CLICKHOUSE URLs: ``chdb:///folder[?database=db]`` and
``clickhouse://user:password@host:9000/db``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from storage.errors import StorageError

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

    def redacted(self) -> str:
        """The URL with the password hidden, for logs and messages."""
        if self.scheme == "chdb":
            return f"chdb://{self.path}?database={self.database}"
        auth = f"{self.user}:***@" if self.password else f"{self.user}@"
        return f"clickhouse://{auth}{self.host}:{self.port}/{self.database}"


def parse(url: str) -> ClickHouseURL:
    """Split a ClickHouse URL into its parts; StorageError names what is wrong."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    if parts.scheme == "chdb":
        folder = unquote(parts.netloc + parts.path)
        if not folder:
            raise StorageError(f"chdb URL needs a folder: chdb:///path/to/folder, got {url!r}")
        database = query.get("database", [DEFAULT_DATABASE])[0]
        return ClickHouseURL("chdb", check_identifier(database),
                             path=Path(folder).expanduser().resolve())
    if parts.scheme in ("clickhouse", "clickhouse+native"):
        try:
            port = parts.port or 9000
        except ValueError:
            raise StorageError(f"bad port in ClickHouse URL {url!r}") from None
        database = parts.path.strip("/") or DEFAULT_DATABASE
        return ClickHouseURL(
            "clickhouse", check_identifier(database), host=parts.hostname or "127.0.0.1",
            port=port, user=unquote(parts.username or "default"),
            password=unquote(parts.password or ""))
    raise StorageError(
        f"unknown ClickHouse URL scheme {parts.scheme!r}: use chdb:///folder or "
        "clickhouse://user:password@host:9000/db")
