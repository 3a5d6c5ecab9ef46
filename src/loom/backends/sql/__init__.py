"""The SQL backend (SQLAlchemy 2 + sqlglot): see ``loom.backends.sql.backend``."""

from loom.backends.sql.backend import SQLBackend
from loom.backends.sql.guard import Checked, Scope, check_statement

__all__ = ["Checked", "SQLBackend", "Scope", "check_statement"]
