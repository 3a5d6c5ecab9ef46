"""Statement checks for the SQL backend: every statement is parsed with ``sqlglot`` and
checked before it runs, and what runs is the checked tree regenerated (without comments), so
a parser trick cannot make the database see something other than what was checked.

Rules: one statement; in read-only mode only SELECT / WITH ... SELECT / set operations /
EXPLAIN of those, with no data-modifying CTE, ``SELECT ... INTO`` or locking clause; every
table named anywhere (joins, subqueries, CTE bodies, EXPLAIN) must be on the allow-list,
compared with the dialect's identifier rules (quoted names keep their case on PostgreSQL);
functions that touch files, the server, extensions or run SQL from a string are refused;
so are casts to PostgreSQL's ``reg*`` types and ``to_reg*`` / ``has_*_privilege`` functions
(they tell which tables outside the list exist); functions that build one huge value in a
single call (``printf`` / ``format`` widths, ``repeat``, ``lpad`` / ``rpad``) take literal
sizes up to ``MAX_GENERATED`` only, since no deadline can stop one long call inside the
database; a row limit is added to a query that has none (and a larger one is lowered).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from loom.errors import BackendRefused

__all__ = ["MAX_GENERATED", "Checked", "Scope", "check_statement", "normalize_name"]

# Functions refused in every mode: they read or write files, load code, change settings,
# signal other sessions, or run SQL given as a string (which would bypass the allow-list).
DENIED_FUNCTIONS = frozenset(
    {
        "load_extension",
        "readfile",
        "writefile",
        "edit",
        "fts3_tokenizer",
        "fts5",
        "sqlite_compileoption_get",
        "sqlite_offset",
        "zeroblob",
        "randomblob",
        "set_config",
        "current_setting",
        "nextval",
        "setval",
        "currval",
        "lastval",
        "query_to_xml",
        "query_to_xml_and_xmlschema",
        "query_to_xmlschema",
        "table_to_xml",
        "table_to_xml_and_xmlschema",
        "cursor_to_xml",
        "schema_to_xml",
        "database_to_xml",
        "ts_stat",
        "ts_rewrite",
        "xpath_table",
        "dblink",
        "copy",
        "txid_current",
        "version",
        "inet_server_addr",
        "inet_client_addr",
        "format_type",
    }
)
DENIED_PREFIXES = (
    "pg_",
    "lo_",
    "dblink",
    "sqlite_",
    "pragma_",
    "xmlexists",
    "file_",
    # PostgreSQL catalog probes: each says whether a table (or schema, role...) exists
    "to_reg",
    "has_",
    "obj_description",
    "col_description",
    "shobj_description",
)

MAX_GENERATED = 10_000
"""The largest width, precision, repeat count or pad length a statement may ask for: one
function call builds that much at once, and a deadline cannot interrupt it."""

# printf / format directives: optional position (PostgreSQL), flags, width, precision
_DIRECTIVE = re.compile(r"%(?:\d+\$)?[-+ 0#,!']*(\*|\d+)?(?:\.(\*|\d*))?")
_SIZED = {"repeat": "times", "pad": "expression"}  # sqlglot node key -> its size argument

_EXPLAIN = re.compile(r"^\s*explain(\s+query\s+plan)?(\s+analyze)?(\s+verbose)?\s+", re.I)


@dataclass(frozen=True, slots=True)
class Scope:
    """What a statement may touch: allowed tables as ``(schema, table)`` keys normalised for
    the dialect (schema ``""`` = the connection's default schema)."""

    dialect: str  # sqlglot dialect: "sqlite", "postgres", ...
    tables: frozenset[tuple[str, str]]
    default_schema: str
    read_only: bool = True
    max_rows: int = 200
    # the database's own functions (PostgreSQL: every function outside the system schemas),
    # which may read any table the role can: refused like the built-in list
    denied_functions: frozenset[str] = frozenset()

    def allows(self, schema: str, table: str) -> bool:
        if schema in ("", self.default_schema):
            return (self.default_schema, table) in self.tables or ("", table) in self.tables
        return (schema, table) in self.tables


@dataclass(frozen=True, slots=True)
class Checked:
    """A statement that passed: the SQL to run and whether it reads (returns rows) only."""

    sql: str
    read_only: bool
    tables: tuple[str, ...]


def normalize_name(name: str, dialect: str, *, quoted: bool = False) -> str:
    """An identifier as the database resolves it: SQLite ignores case; PostgreSQL folds
    unquoted names to lower case and keeps quoted ones as written."""
    if dialect == "sqlite" or not quoted:
        return name.lower()
    return name


def _refuse(why: str) -> BackendRefused:
    return BackendRefused(f"statement refused: {why}")


def check_statement(sql: str, scope: Scope) -> Checked:
    """Parse and check ``sql``; return what to run, or raise ``BackendRefused`` with a reason
    the model can act on."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    if not isinstance(sql, str) or not sql.strip():
        raise _refuse("the statement is empty; send one SQL statement")
    explain = _EXPLAIN.match(sql)
    body = sql[explain.end() :] if explain else sql
    if explain and re.match(r"\s*\(", body):
        raise _refuse("EXPLAIN options in parentheses are not supported; use EXPLAIN SELECT ...")
    logging.getLogger("sqlglot").setLevel(logging.ERROR)  # its fallback warnings are ours
    try:
        parsed = [t for t in sqlglot.parse(body, read=scope.dialect) if t is not None]
    except SqlglotError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise _refuse(f"it does not parse as {scope.dialect} SQL ({first})") from None
    if len(parsed) != 1:
        raise _refuse(
            f"{len(parsed)} statements were sent; send exactly one statement per call"
            if parsed
            else "no statement found"
        )
    tree = parsed[0]
    reads = isinstance(tree, exp.Query)
    if explain:
        if not reads:
            raise _refuse("EXPLAIN is allowed for SELECT queries only")
        if explain.group(2) and scope.dialect != "postgres":
            raise _refuse("EXPLAIN ANALYZE is allowed on PostgreSQL only")
    if scope.read_only and not reads:
        raise _refuse(
            f"this connection is read-only and the statement is a {tree.key.upper()}; only "
            "SELECT, WITH ... SELECT and EXPLAIN SELECT are allowed"
        )
    if not reads and not isinstance(tree, exp.Insert | exp.Update | exp.Delete):
        raise _refuse(
            f"{tree.key.upper()} statements are not allowed; writes are INSERT, UPDATE or "
            "DELETE on allowed tables"
        )
    _check_nodes(tree, scope, reads_only=reads)
    tables = _check_tables(tree, scope)
    if reads:
        tree = _limit(tree, scope.max_rows + 1)  # one more: the result says rows were cut
    out = tree.sql(dialect=scope.dialect, comments=False)
    if explain:
        out = explain.group(0).strip().upper().replace("  ", " ") + " " + out
    return Checked(out, reads, tables)


def _check_nodes(tree: Any, scope: Scope, *, reads_only: bool) -> None:
    from sqlglot import exp

    for node in tree.walk():
        if reads_only and isinstance(node, exp.DML | exp.DDL | exp.Command):
            raise _refuse(
                f"a {node.key.upper()} inside a query (a data-modifying CTE or subquery) is "
                "not allowed"
            )
        if isinstance(node, exp.Into):
            raise _refuse("SELECT ... INTO creates a table; it is not allowed")
        if isinstance(node, exp.Lock):
            raise _refuse("locking clauses (FOR UPDATE / FOR SHARE) are not allowed")
        if isinstance(node, exp.Dot) and isinstance(node.expression, exp.Func):
            raise _refuse("schema-qualified function calls are not allowed")
        if isinstance(node, exp.Command | exp.Pragma | exp.Attach | exp.Detach | exp.Set):
            raise _refuse(f"{node.key.upper()} is not allowed")
        if isinstance(node, exp.Cast) and _type_name(node.to).startswith("reg"):
            raise _refuse(
                f"casts to {_type_name(node.to)} are not allowed (they reveal which tables "
                "exist); name allowed tables directly"
            )
        if isinstance(node, exp.Func):
            _check_sizes(node)
            name = (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()
            names = {name, type(node).key.lower()}
            if any(
                n in DENIED_FUNCTIONS
                or n in scope.denied_functions
                or n.startswith(DENIED_PREFIXES)
                for n in names
            ):
                raise _refuse(
                    f"the function {name}() is not allowed (it reaches files, settings, the "
                    "server or the catalog, or runs SQL from a string)"
                )


def _type_name(to: Any) -> str:
    """The bare, lower-case name of a cast's target type (``pg_catalog.regclass`` → regclass)."""
    return str(to.sql("postgres") if to is not None else "").lower().rsplit(".", 1)[-1]


def _check_sizes(node: Any) -> None:
    """Refuse a function call that would build one value larger than ``MAX_GENERATED``."""
    from sqlglot import exp

    name = (node.name if isinstance(node, exp.Anonymous) else node.key).lower()
    if name in ("printf", "format"):
        args = node.expressions if isinstance(node, exp.Anonymous) else [node.this]
        fmt = args[0] if args else None
        if not (isinstance(fmt, exp.Literal) and fmt.is_string):
            raise _refuse(f"{name}() needs its format as a string literal")
        for width, precision in _DIRECTIVE.findall(fmt.this.replace("%%", "")):
            for size in (width, precision):
                if size == "*":
                    raise _refuse(
                        f"{name}() widths and precisions must be written in the format ('*' "
                        "takes them from arguments)"
                    )
                if size and int(size) > MAX_GENERATED:
                    raise _refuse(f"{name}() width {size} is over the limit of {MAX_GENERATED}")
    elif node.key in _SIZED:
        size = node.args.get(_SIZED[node.key])
        if not (isinstance(size, exp.Literal) and size.is_int and int(size.this) <= MAX_GENERATED):
            raise _refuse(
                f"{node.key}() needs a literal length of at most {MAX_GENERATED}, got "
                f"{size.sql() if size is not None else 'none'}"
            )


def _cte_names(select: Any, table: Any) -> set[str]:
    """The CTE names a table reference inside ``select``'s WITH may mean.

    Conservative: a CTE is visible to CTEs after it; to itself only under WITH RECURSIVE; to
    the main query always. Anything else is checked as a real table.
    """
    from sqlglot import exp

    with_ = select.args.get("with_") or select.args.get("with")
    if with_ is None:
        return set()
    ctes = list(with_.expressions)
    names = [c.alias_or_name.lower() for c in ctes]
    for i, cte in enumerate(ctes):
        node: Any = table
        while node is not None and node is not select:
            if node is cte:
                visible = names[: i + 1] if with_.args.get("recursive") else names[:i]
                return set(visible)
            node = node.parent
    # the table is in the main query, not in a CTE body
    return set(names) if not _inside(table, exp.CTE, stop=select) else set()


def _inside(node: Any, kind: Any, *, stop: Any) -> bool:
    node = node.parent
    while node is not None and node is not stop:
        if isinstance(node, kind):
            return True
        node = node.parent
    return False


def _check_tables(tree: Any, scope: Scope) -> tuple[str, ...]:
    from sqlglot import exp

    seen: list[str] = []
    for table in tree.find_all(exp.Table):
        ident = table.this
        if not isinstance(ident, exp.Identifier):
            # a table function (generate_series(...), json_each(...)) or something odder:
            # functions were checked above; anything that is not a function is refused
            if isinstance(ident, exp.Func):
                continue
            raise _refuse(f"unsupported table expression {table.sql(scope.dialect)!r}")
        if table.args.get("catalog") is not None:
            raise _refuse(f"three-part names ({table.sql(scope.dialect)}) are not allowed")
        name = normalize_name(ident.name, scope.dialect, quoted=bool(ident.quoted))
        db = table.args.get("db")
        schema = (
            normalize_name(db.name, scope.dialect, quoted=bool(db.quoted))
            if isinstance(db, exp.Identifier)
            else ""
        )
        if not schema and _is_cte(table, name):
            continue
        if not scope.allows(schema, name):
            shown = f"{schema}.{name}" if schema else name
            raise _refuse(
                f"table {shown!r} is not one this agent may use; allowed: "
                f"{', '.join(sorted(_shown(scope.tables))) or '(none)'}"
            )
        seen.append(f"{schema}.{name}" if schema else name)
    return tuple(seen)


def _is_cte(table: Any, name: str) -> bool:
    from sqlglot import exp

    node = table.parent
    while node is not None:
        has_with = node.args.get("with_") or node.args.get("with")
        if isinstance(node, exp.Query) and has_with and name in _cte_names(node, table):
            return True
        node = node.parent
    return False


def _shown(tables: Iterable[tuple[str, str]]) -> list[str]:
    return [t for _, t in tables]


def _limit(tree: Any, max_rows: int) -> Any:
    """Add ``LIMIT max_rows`` when absent; lower a larger or computed limit. A set operation
    (UNION, ...) is wrapped in ``SELECT * FROM (...) LIMIT n`` instead. The cursor never
    fetches more than ``max_rows + 1`` rows either way."""
    from sqlglot import exp

    if not isinstance(tree, exp.Select):
        return exp.select("*").from_(tree.subquery("loom_q")).limit(max_rows)
    limit = tree.args.get("limit")
    if limit is None:
        return tree.limit(max_rows)
    value = limit.expression
    if not (isinstance(value, exp.Literal) and value.is_int and int(value.this) <= max_rows):
        limit.set("expression", exp.Literal.number(max_rows))
    return tree
