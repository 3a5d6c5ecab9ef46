"""``SQLBackend``: a database offered as tools (list_tables, describe_table, sample_rows,
query, and execute when enabled), safe by default.

Defense in depth, outermost first: the allow-list of tables is fixed when the backend opens
(views are kept only when their definitions read allowed tables); every statement is checked by
``loom.backends.sql.guard`` and what runs is the checked tree regenerated; in read-only mode a
SQLite file is opened with ``mode=ro`` and an authorizer that denies writes, ATTACH, PRAGMA and
reads of other tables, and a PostgreSQL transaction is ``READ ONLY``; every statement has a
deadline (SQLite: a progress handler; PostgreSQL: ``SET LOCAL statement_timeout``); a SQLite
value (string or blob) may not grow past ``MAX_VALUE_BYTES`` (a progress handler cannot stop
one long call inside SQLite, so the size of what one call builds is bounded instead); the
cursor never fetches more than ``max_rows + 1`` rows.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from loom.backends.base import trim_to_tokens
from loom.backends.sql.format import format_rows
from loom.backends.sql.guard import Checked, Scope, check_statement, normalize_name
from loom.errors import BackendConfigError, BackendRefused, MissingDependencyError, ToolError
from loom.tools.base import FunctionTool, Tool

__all__ = ["MAX_VALUE_BYTES", "SQLBackend"]

MAX_VALUE_BYTES = 10_000_000
"""The largest string or blob a SQLite statement may build or read (SQLITE_LIMIT_LENGTH)."""

_DIALECTS = {"sqlite": "sqlite", "postgresql": "postgres", "mysql": "mysql", "mssql": "tsql"}


class SQLBackend:
    """A SQL database as an agent's domain.

    Args:
        url: Any SQLAlchemy URL (``sqlite:///data.db``, ``postgresql+psycopg://...``).
        tables: The tables (and views) the agent may use, ``name`` or ``schema.name``; default
            every base table of ``schema`` (views only when listed, or when their definitions
            read allowed tables only).
        schema: The schema to work in (default: the connection's default schema).
        read_only: Only SELECT / WITH ... SELECT / EXPLAIN (default True).
        allow_execute: Offer ``execute`` for INSERT / UPDATE / DELETE on allowed tables
            (needs ``read_only=False``).
        max_rows: Rows returned per statement; a LIMIT is added when absent.
        timeout: Seconds a statement may run before the database stops it.
        name: The backend's name (in the ROM text and warnings).
        prefix: Put before each tool name (``"sales_"`` → ``sales_query``) to use several.
    """

    def __init__(
        self,
        url: str,
        *,
        tables: Sequence[str] | None = None,
        schema: str | None = None,
        read_only: bool = True,
        allow_execute: bool = False,
        max_rows: int = 200,
        timeout: float = 10.0,
        name: str = "sql",
        prefix: str = "",
    ) -> None:
        try:
            import sqlalchemy  # noqa: F401
            import sqlglot  # noqa: F401
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MissingDependencyError(
                exc.name or "sqlalchemy", "backends", "SQLBackend"
            ) from exc
        if allow_execute and read_only:
            raise BackendConfigError(
                "allow_execute=True needs read_only=False (a read-only backend never writes)"
            )
        if max_rows <= 0 or timeout <= 0:
            raise BackendConfigError("max_rows and timeout must be positive")
        self.url, self.name, self.prefix = url, name, prefix
        self.read_only, self.allow_execute = read_only, allow_execute
        self.max_rows, self.timeout = max_rows, timeout
        self._requested = list(tables) if tables is not None else None
        self._schema_arg = schema
        self._lock = threading.Lock()
        self._engine: Any = None
        self._scope: Scope | None = None
        self._info: dict[str, dict[str, Any]] = {}  # table -> columns, pk, fks, comment
        self._tools: list[Tool] | None = None
        self._schema_cache: dict[int, str] = {}
        self.config: dict[str, Any] | None = None  # the AGENT.md entry it came from
        self.problems: list[str] = []  # views left out, ...
        self.open()  # fail at configuration time, not at the first question

    # -- connection ---------------------------------------------------------------------------
    @property
    def dialect(self) -> str:
        return self.scope.dialect

    @property
    def scope(self) -> Scope:
        if self._scope is None:
            self.open()
        assert self._scope is not None
        return self._scope

    def open(self) -> None:
        """Connect, reflect the schema and fix the allow-list (idempotent)."""
        with self._lock:
            if self._scope is not None:
                return
            from sqlalchemy import create_engine
            from sqlalchemy.engine import make_url
            from sqlalchemy.exc import ArgumentError, SQLAlchemyError

            try:
                url = make_url(self.url)
            except ArgumentError as exc:
                raise BackendConfigError(
                    f"{self.url!r} is not a database URL ({exc}); write it like "
                    "'sqlite:///data.db' or 'postgresql+psycopg://user@host/db'"
                ) from None
            backend = url.get_backend_name()
            dialect = _DIALECTS.get(backend, backend)
            kwargs: dict[str, Any] = {}
            if backend == "sqlite":
                url, kwargs = self._sqlite_url(url)
            try:
                engine = create_engine(url, **kwargs)
                with engine.connect() as conn:
                    default = conn.dialect.default_schema_name or ""
                    self._reflect(conn, dialect, default)
            except SQLAlchemyError as exc:
                raise BackendConfigError(f"cannot open {self._shown_url()}: {exc}") from None
            except ImportError as exc:
                raise BackendConfigError(
                    f"the driver for {backend!r} is not installed ({exc}); install it "
                    "(for PostgreSQL: pip install 'loom-agents[postgres]')"
                ) from None
            self._engine = engine

    def _shown_url(self) -> str:
        from sqlalchemy.engine import make_url

        try:
            return make_url(self.url).render_as_string(hide_password=True)
        except Exception:
            return "the database"

    def _sqlite_url(self, url: Any) -> tuple[Any, dict[str, Any]]:
        from pathlib import Path

        db = url.database or ""
        if not db or db == ":memory:":
            raise BackendConfigError(
                "a SQLite backend needs a database file (sqlite:///path/to/data.db), not an "
                "in-memory database"
            )
        if not Path(db).is_file():
            raise BackendConfigError(f"SQLite database {db!r} does not exist")
        import sqlite3

        mode = "ro" if self.read_only else "rw"
        # mode=ro: even a statement that got past every check cannot write the file
        uri = f"file:{Path(db).resolve().as_posix()}?mode={mode}"

        def connect() -> sqlite3.Connection:
            return sqlite3.connect(uri, uri=True, check_same_thread=False)

        return url.set(database=""), {"creator": connect}

    def _reflect(self, conn: Any, dialect: str, default: str) -> None:
        from sqlalchemy import inspect

        insp = inspect(conn)
        schema = self._schema_arg or None
        working = normalize_name(self._schema_arg or default or "", dialect)
        tables = list(insp.get_table_names(schema=schema))
        views = list(insp.get_view_names(schema=schema))
        norm = {normalize_name(t, dialect, quoted=True): t for t in [*tables, *views]}
        if self._requested is None:
            chosen = [normalize_name(t, dialect, quoted=True) for t in tables]
            chosen += [normalize_name(v, dialect, quoted=True) for v in views]
        else:
            chosen = []
            for entry in self._requested:
                sch, _, tab = entry.rpartition(".")
                key = normalize_name(tab, dialect, quoted=True)
                if sch and normalize_name(sch, dialect) != working:
                    raise BackendConfigError(
                        f"table {entry!r} is in schema {sch!r}, but this backend works in "
                        f"{working!r}; make one backend per schema (schema=...)"
                    )
                if key not in norm:
                    raise BackendConfigError(
                        f"table {entry!r} does not exist in {self._shown_url()}; tables there: "
                        f"{', '.join(sorted(norm)) or '(none)'}"
                    )
                chosen.append(key)
        view_keys = {normalize_name(v, dialect, quoted=True) for v in views}
        scope = Scope(
            dialect, frozenset((working, t) for t in chosen), working, self.read_only, self.max_rows
        )
        for v in [c for c in chosen if c in view_keys]:
            why = self._view_problem(insp, norm[v], schema, scope)
            if why is None:
                continue
            if self._requested is not None:
                raise BackendConfigError(f"view {v!r} cannot be allowed: {why}")
            chosen.remove(v)
            self.problems.append(f"view {v!r} is not offered: {why}")
        self._scope = Scope(
            dialect,
            frozenset((working, t) for t in chosen),
            working,
            self.read_only,
            self.max_rows,
            self._user_functions(conn, dialect),
        )
        for key in chosen:
            real = norm[key]
            cols = insp.get_columns(real, schema=schema)
            try:
                pk = insp.get_pk_constraint(real, schema=schema).get("constrained_columns") or []
                fks = insp.get_foreign_keys(real, schema=schema)
            except NotImplementedError:
                pk, fks = [], []
            try:
                comment = insp.get_table_comment(real, schema=schema).get("text")
            except NotImplementedError:
                comment = None
            self._info[key] = {
                "real": real,
                "columns": cols,
                "pk": pk,
                "fks": fks,
                "comment": comment,
                "view": key in view_keys,
            }

    def _user_functions(self, conn: Any, dialect: str) -> frozenset[str]:
        """Names of the database's own functions (PostgreSQL), which the checks refuse."""
        if dialect != "postgres":
            return frozenset()
        from sqlalchemy import text

        rows = conn.execute(
            text(
                "SELECT DISTINCT lower(p.proname) FROM pg_proc p JOIN pg_namespace n "
                "ON n.oid = p.pronamespace WHERE n.nspname NOT IN ('pg_catalog', "
                "'information_schema') AND n.nspname NOT LIKE 'pg_toast%'"
            )
        )
        return frozenset(r[0] for r in rows)

    def _view_problem(self, insp: Any, view: str, schema: str | None, scope: Scope) -> str | None:
        """Why a view may not be allowed (its definition reads other tables), or None."""
        import sqlglot
        from sqlglot import exp

        try:
            definition = insp.get_view_definition(view, schema=schema)
            tree = sqlglot.parse_one(definition, read=scope.dialect)
        except Exception as exc:
            return f"its definition cannot be read or parsed ({exc})"
        if isinstance(tree, exp.Create):
            tree = tree.expression
        try:
            check_statement(tree.sql(dialect=scope.dialect), scope)
        except BackendRefused as exc:
            return f"its definition is refused ({exc})"
        return None

    # -- running statements -------------------------------------------------------------------
    @contextlib.contextmanager
    def _guarded(self, checked: Checked, *, read_only: bool) -> Iterator[tuple[Any, Any]]:
        """A raw connection and cursor for one checked statement, under its guard rails (the
        deadline, SQLite's authorizer, PostgreSQL's transaction settings); any failure is
        rolled back and answered as the backend's error, and the rails come off after."""
        import sqlite3

        self.open()
        raw = self._engine.raw_connection()
        deadline = time.monotonic() + self.timeout
        sqlite = self.dialect == "sqlite"
        driver = raw.driver_connection
        length = None
        try:
            if sqlite:
                driver.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
                driver.set_authorizer(self._authorizer(checked))
                length = driver.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
            cur = raw.cursor()
            if self.dialect == "postgres":
                self._pg_setup(cur, read_only=read_only)
            yield raw, cur
        except Exception as exc:
            with contextlib.suppress(Exception):  # the connection may be gone already
                raw.rollback()
            raise self._error(exc, deadline) from None
        finally:
            if sqlite:
                driver.set_progress_handler(None, 0)
                driver.set_authorizer(None)
                if length is not None:
                    driver.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, length)
            raw.close()

    def run_checked(self, checked: Checked) -> tuple[list[str], list[tuple[Any, ...]], bool]:
        """Run a checked statement under the deadline; (columns, rows, more rows existed)."""
        with self._guarded(checked, read_only=checked.read_only) as (raw, cur):
            cur.execute(checked.sql)
            columns = [d[0] for d in cur.description or ()]
            rows = [tuple(r) for r in cur.fetchmany(self.max_rows + 1)] if columns else []
            more = len(rows) > self.max_rows
            if checked.read_only:
                raw.rollback()
            else:
                raw.commit()
            return columns, rows[: self.max_rows], more

    def _pg_setup(self, cur: Any, *, read_only: bool) -> None:
        """This transaction's guard rails: read-only, a deadline, and the working schema first
        on the search path (so an unqualified name means the table the checks allowed)."""
        from sqlglot import exp

        if read_only:
            cur.execute("SET TRANSACTION READ ONLY")
        cur.execute(f"SET LOCAL statement_timeout = {int(self.timeout * 1000)}")
        schema = exp.to_identifier(self.scope.default_schema, quoted=True).sql("postgres")
        cur.execute(f"SET LOCAL search_path = {schema}, pg_catalog")

    def _error(self, exc: Exception, deadline: float) -> ToolError:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if time.monotonic() >= deadline or "statement timeout" in text or "interrupted" in text:
            return ToolError(
                f"the statement ran longer than {self.timeout:g}s and was stopped; narrow it "
                "(WHERE, LIMIT, fewer joins) or aggregate less",
                code="timeout",
            )
        if "too big" in text:
            return ToolError(
                f"a value in the statement grew past {MAX_VALUE_BYTES} bytes, this backend's "
                "limit, and the statement was stopped; build smaller values",
                code="too_large",
            )
        if any(w in text for w in ("not authorized", "prohibited", "read-only", "readonly")):
            return BackendRefused(f"the database refused the statement: {text}")
        return ToolError(f"the database reported an error: {text}", code="sql_error")

    def _authorizer(self, checked: Checked) -> Any:
        import sqlite3

        readable = {t for _, t in self.scope.tables}
        denied_always = {
            sqlite3.SQLITE_ATTACH,
            sqlite3.SQLITE_DETACH,
            sqlite3.SQLITE_PRAGMA,
            getattr(sqlite3, "SQLITE_CREATE_VTABLE", 29),
            getattr(sqlite3, "SQLITE_DROP_VTABLE", 30),
        }
        writes = {sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE}
        read_only = checked.read_only
        ok_actions = {
            sqlite3.SQLITE_SELECT,
            sqlite3.SQLITE_READ,
            sqlite3.SQLITE_FUNCTION,
            getattr(sqlite3, "SQLITE_RECURSIVE", 33),
        }
        if not read_only:
            ok_actions |= writes | {sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT}
        denied_fn = ("load_extension", "readfile", "writefile", "fts3_tokenizer", "edit")

        def decide(action: int, a1: str | None, a2: str | None, db: str | None, _src: Any) -> int:
            if action in denied_always or action not in ok_actions:
                return sqlite3.SQLITE_DENY
            if action == sqlite3.SQLITE_FUNCTION and (a2 or "").lower() in denied_fn:
                return sqlite3.SQLITE_DENY
            # db is None for a CTE or subquery; a real table names its database
            if (
                action in (sqlite3.SQLITE_READ, *writes)
                and db is not None
                and (db != "main" or (a1 or "").lower() not in readable)
            ):
                return sqlite3.SQLITE_DENY
            return sqlite3.SQLITE_OK

        return decide

    def check(self, sql: str, *, write: bool = False) -> Checked:
        """The checked form of ``sql`` (raises ``BackendRefused``); writes only via execute."""
        scope = self.scope
        if write:
            from dataclasses import replace

            scope = replace(scope, read_only=False)
        else:
            from dataclasses import replace

            scope = replace(scope, read_only=True)
        return check_statement(sql, scope)

    # -- tools --------------------------------------------------------------------------------
    def tools(self) -> list[Tool]:
        if self._tools is None:
            self._tools = self._make_tools()
        return self._tools

    def _table_key(self, table: str) -> str:
        sch, _, tab = table.strip().rpartition(".")
        key = normalize_name(tab.strip('"`[]'), self.dialect, quoted=True)
        if sch and normalize_name(sch, self.dialect) != self.scope.default_schema:
            key = ""
        if key not in self._info:
            raise BackendRefused(
                f"table {table!r} is not one this agent may use; allowed: "
                f"{', '.join(sorted(self._info)) or '(none)'}"
            )
        return key

    def _quoted(self, key: str) -> str:
        from sqlglot import exp

        ident = exp.to_identifier(str(self._info[key]["real"]), quoted=True)
        return str(ident.sql(dialect=self.dialect))

    def _make_tools(self) -> list[Tool]:
        backend = self
        timeout = self.timeout + 5  # the database's own deadline fires first

        def list_tables() -> str:
            """List the tables this agent may query, with their column names."""
            return (
                "\n".join(
                    f"{k}({', '.join(c['name'] for c in v['columns'])})"
                    for k, v in backend._info.items()
                )
                or "(no tables are allowed)"
            )

        def describe_table(table: str) -> str:
            """Describe one table: columns, types, nullability, keys and comments.

            Args:
                table: The table's name, as list_tables shows it.
            """
            return backend.describe(backend._table_key(table))

        def sample_rows(table: str, n: int = 5) -> str:
            """Show a few rows of a table.

            Args:
                table: The table's name.
                n: How many rows (1-50).
            """
            key = backend._table_key(table)
            n = max(1, min(int(n), 50))
            checked = backend.check(f"SELECT * FROM {backend._quoted(key)} LIMIT {n}")
            return backend._rows(checked)

        def query(sql: str) -> str:
            """Run one read-only SQL query and return its rows as a table.

            SELECT, WITH ... SELECT and EXPLAIN are accepted; a row limit is added when the
            statement has none.

            Args:
                sql: Exactly one SQL statement.
            """
            return backend._rows(backend.check(sql))

        def execute(sql: str) -> str:
            """Run one INSERT, UPDATE or DELETE on an allowed table and say how many rows
            changed.

            Args:
                sql: Exactly one SQL statement.
            """
            checked = backend.check(sql, write=True)
            if checked.read_only:
                return backend._rows(checked)
            return backend.run_write(checked)

        p = self.prefix
        made: list[Tool] = [
            FunctionTool(list_tables, name=f"{p}list_tables", effect="pure", timeout=timeout),
            FunctionTool(describe_table, name=f"{p}describe_table", effect="pure", timeout=timeout),
            FunctionTool(sample_rows, name=f"{p}sample_rows", effect="pure", timeout=timeout),
            FunctionTool(query, name=f"{p}query", effect="pure", timeout=timeout),
        ]
        if self.allow_execute:
            made.append(
                FunctionTool(execute, name=f"{p}execute", effect="at_most_once", timeout=timeout)
            )
        return made

    def _rows(self, checked: Checked) -> str:
        columns, rows, more = self.run_checked(checked)
        return format_rows(columns, rows, more=more, max_rows=self.max_rows)

    def run_write(self, checked: Checked) -> str:
        """Run a checked write and report the changed row count."""
        with self._guarded(checked, read_only=False) as (raw, cur):
            cur.execute(checked.sql)
            count = cur.rowcount
            raw.commit()
            return f"{count} row{'s' if count != 1 else ''} changed"

    # -- schema text --------------------------------------------------------------------------
    def describe(self, key: str) -> str:
        info = self._info[key]
        kind = "view" if info["view"] else "table"
        lines = [f"{kind} {key}" + (f" -- {info['comment']}" if info["comment"] else "")]
        for line in self._column_lines(info):
            lines.append("  " + line)
        return "\n".join(lines)

    def _column_lines(self, info: dict[str, Any]) -> list[str]:
        refs = {}
        for fk in info["fks"]:
            for col, ref in zip(
                fk.get("constrained_columns") or [], fk.get("referred_columns") or [], strict=False
            ):
                refs[col] = f"{fk.get('referred_table')}.{ref}"
        out = []
        for c in info["columns"]:
            bits = [c["name"], str(c["type"])]
            if c["name"] in info["pk"]:
                bits.append("PRIMARY KEY")
            if not c.get("nullable", True) and c["name"] not in info["pk"]:
                bits.append("NOT NULL")
            if c["name"] in refs:
                bits.append(f"-> {refs[c['name']]}")
            if c.get("comment"):
                bits.append(f"-- {c['comment']}")
            out.append(" ".join(bits))
        return out

    def schema_text(self, budget: int) -> str:
        hit = self._schema_cache.get(budget)
        if hit is not None:
            return hit
        mode = "read-only" if self.read_only else "read-write"
        tools = f"{self.prefix}query" + (f", {self.prefix}execute" if self.allow_execute else "")
        lines = [
            f"SQL database {self.name!r} ({self.dialect}, {mode}; use {tools}; at most "
            f"{self.max_rows} rows per statement). Tables you may use:"
        ]
        # one compact line per table first (every table named), then the details
        for key, info in self._info.items():
            cols = ", ".join(self._column_lines(info))
            comment = f" -- {info['comment']}" if info["comment"] else ""
            lines.append(f"- {key}({cols}){comment}")
        text = trim_to_tokens(lines, budget)
        self._schema_cache[budget] = text
        return text

    def close(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.dispose()
        self._scope = None

    def __repr__(self) -> str:
        return f"SQLBackend({self._shown_url()!r}, read_only={self.read_only})"
