"""One exception hierarchy for the library; `serving/` maps it to HTTP status codes."""

from __future__ import annotations


class RelayGRError(Exception):
    """Base class of every error the library raises on purpose."""


class ConfigError(RelayGRError, ValueError):
    """A config file, section, key or value is invalid."""


class DataError(RelayGRError, ValueError):
    """A data file (an event log, a MovieLens file) cannot be read as the config describes it; the message
    names the file, the line, the column and the value."""


class WorkloadError(RelayGRError, ValueError):
    """A benchmark workload's parameters or file are invalid."""


class InvalidRequest(RelayGRError, ValueError):
    """Caller input is malformed; `field` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class BundleError(RelayGRError):
    """A serving bundle is missing, incomplete or corrupt."""


class Overloaded(RelayGRError):
    """The instance cannot serve this request within its SLO; retry elsewhere."""
