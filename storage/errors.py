"""Errors of the storage package, rooted in FailslowError."""

from failslow.schema.errors import FailslowError


class StorageError(FailslowError):
    """ClickHouse is unreachable, refused a statement, or the URL/schema is wrong."""


class QueryError(StorageError):
    """ClickHouse rejected a statement (bad SQL, unknown table, type mismatch)."""


class FolderBusyError(StorageError):
    """A chdb data folder is owned by another process that serves no query endpoint."""
