"""The schema and statements of ``PostgresStore`` (kept apart so tests can EXPLAIN them).

The tables mirror ``SQLiteStore``'s (``loom.store.sqlite_db``): append-only history tables
clustered by ``(session_id, seq)``, ``open_calls`` / ``open_runs`` indexing what is still open,
a ``locks`` row per session whose fencing ``token`` only ever grows. Timestamps are epoch
seconds (``double precision``), JSON values are the ``loom.store.codec`` text (``text``, not
``jsonb``: the codec keeps NaN / Infinity and key order, which ``jsonb`` would refuse or
reorder), so both stores keep and return exactly the same values.

Migrations are named and applied in order, each in the same transaction as its row in
``loom_migrations``, under a transaction-level advisory lock so that several processes starting
at once do not race. Never edit one that has shipped: add a new one.
"""

from __future__ import annotations

from loom.store import budget_sql, schedule_sql

# pg_advisory_xact_lock key for migrations ("LOOM" in ASCII), shared by every Loom schema
# of a database: migrations of different schemas just take turns.
MIGRATION_LOCK = 0x4C4F4F4D

# SQLSTATE raised by loom_check_lease when the token is stale (a custom class, "LM").
LEASE_LOST_SQLSTATE = "LM001"

MIGRATIONS: list[tuple[str, list[str]]] = [
    (
        "0001_initial",
        [
            """CREATE TABLE sessions (
                id TEXT PRIMARY KEY,
                agent_name TEXT NOT NULL DEFAULT '',
                created_at DOUBLE PRECISION NOT NULL,
                updated_at DOUBLE PRECISION NOT NULL,
                input_tokens BIGINT NOT NULL DEFAULT 0,
                output_tokens BIGINT NOT NULL DEFAULT 0,
                requests BIGINT NOT NULL DEFAULT 0,
                metadata TEXT NOT NULL DEFAULT '{}'
            )""",
            """CREATE TABLE messages (
                session_id TEXT NOT NULL,
                seq BIGINT NOT NULL,
                role TEXT NOT NULL,
                data TEXT NOT NULL,
                appended_at DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (session_id, seq)
            )""",
            """CREATE TABLE events (
                session_id TEXT NOT NULL,
                seq BIGINT NOT NULL,
                run_id TEXT NOT NULL,
                sequence BIGINT NOT NULL,
                type TEXT NOT NULL,
                iteration BIGINT NOT NULL,
                timestamp DOUBLE PRECISION NOT NULL,
                data TEXT NOT NULL,
                PRIMARY KEY (session_id, seq)
            )""",
            "CREATE INDEX events_run ON events (session_id, run_id, seq)",
            """CREATE TABLE ledger (
                session_id TEXT NOT NULL,
                seq BIGINT NOT NULL,
                run_id TEXT NOT NULL,
                tool_call_id TEXT NOT NULL,
                name TEXT NOT NULL,
                status TEXT NOT NULL,
                effect TEXT NOT NULL,
                arguments TEXT NOT NULL,
                result TEXT,
                timestamp DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (session_id, seq)
            )""",
            """CREATE TABLE open_calls (
                session_id TEXT NOT NULL,
                run_id TEXT NOT NULL,
                tool_call_id TEXT NOT NULL,
                ledger_seq BIGINT NOT NULL,
                PRIMARY KEY (session_id, run_id, tool_call_id)
            )""",
            """CREATE TABLE runs (
                id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                session_id TEXT NOT NULL,
                run_id TEXT NOT NULL,
                status TEXT NOT NULL,
                input_tokens BIGINT NOT NULL,
                output_tokens BIGINT NOT NULL,
                requests BIGINT NOT NULL,
                timestamp DOUBLE PRECISION NOT NULL,
                data TEXT NOT NULL
            )""",
            "CREATE INDEX runs_session ON runs (session_id, id)",
            """CREATE TABLE open_runs (
                session_id TEXT NOT NULL,
                run_id TEXT NOT NULL,
                run_row BIGINT NOT NULL,
                PRIMARY KEY (session_id, run_id)
            )""",
            """CREATE TABLE errors (
                id TEXT PRIMARY KEY,
                timestamp DOUBLE PRECISION NOT NULL,
                session_id TEXT NOT NULL,
                run_id TEXT NOT NULL,
                tool_call_id TEXT NOT NULL,
                tool_name TEXT NOT NULL,
                raw_error TEXT NOT NULL,
                short_summary TEXT NOT NULL
            )""",
            "CREATE INDEX errors_session ON errors (session_id)",
            "CREATE INDEX errors_timestamp ON errors (timestamp)",
            "CREATE INDEX errors_tool ON errors (tool_name)",
            # content is UTF-8 bytes: a tool's output may hold NUL, which text columns refuse.
            """CREATE TABLE results (
                ref TEXT PRIMARY KEY,
                session_id TEXT NOT NULL,
                run_id TEXT NOT NULL,
                tool_call_id TEXT NOT NULL,
                tool_name TEXT NOT NULL,
                created_at DOUBLE PRECISION NOT NULL,
                content BYTEA NOT NULL
            )""",
            "CREATE INDEX results_created ON results (created_at)",
            "CREATE INDEX results_session ON results (session_id)",
            """CREATE TABLE kv (
                namespace TEXT NOT NULL,
                key TEXT NOT NULL,
                value TEXT NOT NULL,
                updated_at DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (namespace, key)
            )""",
            # One row per session that ever had a lease; never deleted, so tokens only grow.
            """CREATE TABLE locks (
                session_id TEXT PRIMARY KEY,
                run_id TEXT NOT NULL,
                host TEXT NOT NULL,
                pid INTEGER NOT NULL,
                acquired_at DOUBLE PRECISION NOT NULL,
                expires_at DOUBLE PRECISION NOT NULL,
                token BIGINT NOT NULL,
                released BOOLEAN NOT NULL DEFAULT false
            )""",
            # The fence of a leased append: locks the session's lock row until the commit and
            # raises LM001 when the token is stale, so that the statements pipelined after it
            # in the same transaction never commit.
            f"""CREATE FUNCTION loom_check_lease(p_session TEXT, p_token BIGINT)
            RETURNS void LANGUAGE plpgsql AS $$
            DECLARE
                cur RECORD;
            BEGIN
                SELECT token, released INTO cur FROM locks
                    WHERE session_id = p_session FOR UPDATE;
                IF NOT FOUND OR cur.token <> p_token OR cur.released THEN
                    RAISE EXCEPTION 'lease of session % with token % is stale', p_session, p_token
                        USING ERRCODE = '{LEASE_LOST_SQLSTATE}';
                END IF;
            END
            $$""",
        ],
    ),
    (
        # Appends are idempotent: each carries a random id recorded in the same transaction,
        # so a commit re-sent after a dropped connection is recognised (the id is taken)
        # instead of being written twice.
        "0002_append_ids",
        [
            """CREATE TABLE appends (
                session_id TEXT NOT NULL,
                id TEXT NOT NULL,
                at DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (session_id, id)
            )""",
        ],
    ),
    # schedules, their runs, cron monitors and check-ins (issue #18, loom.schedule)
    ("0003_schedules", schedule_sql.POSTGRES),
    (
        # One step, one statement: ``loom_append`` does on the server what an append used to
        # send as eight-odd pipelined statements (the id, the fence, the session's turn, the
        # session row, messages, events, ledger rows with ``open_calls``, the run record with
        # ``open_runs``), in the same order and with the same effects. Called in autocommit it
        # is its own transaction: one round trip, one commit, and psycopg prepares it once per
        # connection. The profile said why: per statement, psycopg's pipeline bookkeeping and
        # query conversion cost more client CPU than the server's work.
        "0004_append_function",
        [
            """CREATE FUNCTION loom_append(
                p_session TEXT, p_id TEXT, p_now DOUBLE PRECISION, p_token BIGINT,
                p_usage BIGINT[],
                m_role TEXT[], m_data TEXT[],
                e_run TEXT[], e_sequence BIGINT[], e_type TEXT[], e_iteration BIGINT[],
                e_ts DOUBLE PRECISION[], e_data TEXT[],
                l_run TEXT[], l_call TEXT[], l_name TEXT[], l_status TEXT[], l_effect TEXT[],
                l_arguments TEXT[], l_result TEXT[], l_ts DOUBLE PRECISION[],
                r_run TEXT, r_status TEXT, r_input BIGINT, r_output BIGINT, r_requests BIGINT,
                r_ts DOUBLE PRECISION, r_data TEXT
            ) RETURNS void LANGUAGE plpgsql AS $$
            DECLARE
                n BIGINT;
                row_id BIGINT;
            BEGIN
                -- first: a re-sent append whose first attempt committed stops here
                INSERT INTO appends (session_id, id, at) VALUES (p_session, p_id, p_now);
                IF p_token IS NOT NULL THEN  -- the fence, before any write
                    PERFORM loom_check_lease(p_session, p_token);
                END IF;
                -- appends to one session take turns, so numbering by max(seq) never collides
                PERFORM pg_advisory_xact_lock(19535, hashtext(p_session));
                IF p_usage IS NULL THEN
                    INSERT INTO sessions (id, created_at, updated_at)
                        VALUES (p_session, p_now, p_now) ON CONFLICT (id) DO NOTHING;
                ELSE
                    INSERT INTO sessions (id, created_at, updated_at, input_tokens,
                            output_tokens, requests)
                        VALUES (p_session, p_now, p_now, p_usage[1], p_usage[2], p_usage[3])
                        ON CONFLICT (id) DO UPDATE SET updated_at = excluded.updated_at,
                        input_tokens = sessions.input_tokens + excluded.input_tokens,
                        output_tokens = sessions.output_tokens + excluded.output_tokens,
                        requests = sessions.requests + excluded.requests;
                END IF;
                IF cardinality(m_role) > 0 THEN
                    SELECT coalesce(max(seq) + 1, 0) INTO n FROM messages
                        WHERE session_id = p_session;
                    INSERT INTO messages (session_id, seq, role, data, appended_at)
                        SELECT p_session, n + t.ord - 1, t.role, t.data, p_now
                        FROM unnest(m_role, m_data) WITH ORDINALITY AS t(role, data, ord);
                END IF;
                IF cardinality(e_run) > 0 THEN
                    -- tailing servers (loom.server.queued) LISTEN here; sent at commit only
                    PERFORM pg_notify('loom_events', p_session);
                    SELECT coalesce(max(seq) + 1, 0) INTO n FROM events
                        WHERE session_id = p_session;
                    INSERT INTO events (session_id, seq, run_id, sequence, type, iteration,
                            timestamp, data)
                        SELECT p_session, n + t.ord - 1, t.run_id, t.sequence, t.type,
                            t.iteration, t.ts, t.data
                        FROM unnest(e_run, e_sequence, e_type, e_iteration, e_ts, e_data)
                        WITH ORDINALITY AS t(run_id, sequence, type, iteration, ts, data, ord);
                END IF;
                IF cardinality(l_run) > 0 THEN
                    SELECT coalesce(max(seq) + 1, 0) INTO n FROM ledger
                        WHERE session_id = p_session;
                    FOR i IN 1 .. cardinality(l_run) LOOP
                        INSERT INTO ledger (session_id, seq, run_id, tool_call_id, name, status,
                                effect, arguments, result, timestamp)
                            VALUES (p_session, n, l_run[i], l_call[i], l_name[i], l_status[i],
                                l_effect[i], l_arguments[i], l_result[i], l_ts[i]);
                        IF l_status[i] = 'started' THEN
                            INSERT INTO open_calls (session_id, run_id, tool_call_id, ledger_seq)
                                VALUES (p_session, l_run[i], l_call[i], n)
                                ON CONFLICT (session_id, run_id, tool_call_id)
                                DO UPDATE SET ledger_seq = excluded.ledger_seq;
                        ELSE
                            DELETE FROM open_calls WHERE session_id = p_session
                                AND run_id = l_run[i] AND tool_call_id = l_call[i];
                        END IF;
                        n := n + 1;
                    END LOOP;
                END IF;
                IF r_run IS NOT NULL THEN
                    INSERT INTO runs (session_id, run_id, status, input_tokens, output_tokens,
                            requests, timestamp, data)
                        VALUES (p_session, r_run, r_status, r_input, r_output, r_requests, r_ts,
                            r_data)
                        RETURNING id INTO row_id;
                    IF r_status = 'running' THEN
                        INSERT INTO open_runs (session_id, run_id, run_row)
                            VALUES (p_session, r_run, row_id)
                            ON CONFLICT (session_id, run_id)
                            DO UPDATE SET run_row = excluded.run_row;
                    ELSE
                        DELETE FROM open_runs WHERE session_id = p_session AND run_id = r_run;
                    END IF;
                END IF;
            END
            $$""",
        ],
    ),
    (
        # INTAKE read a session's whole journal to find its remembered permission decisions;
        # this partial index holds only the approval events (as SQLite's 0006).
        "0005_approval_events_index",
        [
            "CREATE INDEX events_approvals ON events (session_id, seq) "
            "WHERE type IN ('approval_required', 'approval_decision')",
        ],
    ),
    # the API key that owns each schedule and monitor (as SQLite's 0007; schedule_sql)
    ("0006_schedule_principals", schedule_sql.PRINCIPALS),
    # resume read a session's whole transcript; its memory entries (system messages) come
    # through this partial index and the rest is the recent tail (as SQLite's 0008)
    (
        "0007_system_messages_index",
        ["CREATE INDEX messages_system ON messages (session_id, seq) WHERE role = 'system'"],
    ),
    (
        # Group commit (issue #26): the appends of many sessions that queued while the previous
        # commit was in flight, in one statement and one transaction (one WAL flush for all).
        # Each member is ``loom_append`` inside its own exception block, a subtransaction: a
        # member whose lease is stale (LM001) is rolled back alone and reported 'lease'; one
        # whose id is already recorded (a batch re-sent after a dropped connection) is 'dup';
        # the others commit. Row arrays of all members are concatenated; ``a_msgs`` / ``a_evs``
        # / ``a_leds`` hold each member's end offset into them, ``a_usage`` three entries a
        # member (NULL: no run record).
        "0008_append_many",
        [
            """CREATE FUNCTION loom_append_many(
                a_session TEXT[], a_id TEXT[], a_now DOUBLE PRECISION[], a_token BIGINT[],
                a_usage BIGINT[], a_msgs BIGINT[], a_evs BIGINT[], a_leds BIGINT[],
                m_role TEXT[], m_data TEXT[],
                e_run TEXT[], e_sequence BIGINT[], e_type TEXT[], e_iteration BIGINT[],
                e_ts DOUBLE PRECISION[], e_data TEXT[],
                l_run TEXT[], l_call TEXT[], l_name TEXT[], l_status TEXT[], l_effect TEXT[],
                l_arguments TEXT[], l_result TEXT[], l_ts DOUBLE PRECISION[],
                r_run TEXT[], r_status TEXT[], r_input BIGINT[], r_output BIGINT[],
                r_requests BIGINT[], r_ts DOUBLE PRECISION[], r_data TEXT[]
            ) RETURNS TEXT[] LANGUAGE plpgsql AS $$
            DECLARE
                done TEXT[] := '{}';
                m0 BIGINT := 0;
                e0 BIGINT := 0;
                l0 BIGINT := 0;
                tbl TEXT;
            BEGIN
                FOR i IN 1 .. cardinality(a_session) LOOP
                    BEGIN
                        PERFORM loom_append(a_session[i], a_id[i], a_now[i], a_token[i],
                            CASE WHEN a_usage[3 * i - 2] IS NULL THEN NULL
                                ELSE a_usage[3 * i - 2 : 3 * i] END,
                            m_role[m0 + 1 : a_msgs[i]], m_data[m0 + 1 : a_msgs[i]],
                            e_run[e0 + 1 : a_evs[i]], e_sequence[e0 + 1 : a_evs[i]],
                            e_type[e0 + 1 : a_evs[i]], e_iteration[e0 + 1 : a_evs[i]],
                            e_ts[e0 + 1 : a_evs[i]], e_data[e0 + 1 : a_evs[i]],
                            l_run[l0 + 1 : a_leds[i]], l_call[l0 + 1 : a_leds[i]],
                            l_name[l0 + 1 : a_leds[i]], l_status[l0 + 1 : a_leds[i]],
                            l_effect[l0 + 1 : a_leds[i]], l_arguments[l0 + 1 : a_leds[i]],
                            l_result[l0 + 1 : a_leds[i]], l_ts[l0 + 1 : a_leds[i]],
                            r_run[i], r_status[i], r_input[i], r_output[i], r_requests[i],
                            r_ts[i], r_data[i]);
                        done := array_append(done, 'ok');
                    EXCEPTION
                        WHEN SQLSTATE 'LM001' THEN
                            done := array_append(done, 'lease');
                        WHEN unique_violation THEN
                            GET STACKED DIAGNOSTICS tbl = TABLE_NAME;
                            IF tbl IS DISTINCT FROM 'appends' THEN
                                RAISE;
                            END IF;
                            done := array_append(done, 'dup');
                    END;
                    m0 := a_msgs[i];
                    e0 := a_evs[i];
                    l0 := a_leds[i];
                END LOOP;
                RETURN done;
            END
            $$""",
        ],
    ),
    (
        # Media stored once (issue #27, as SQLite's 0009): the bytes one ``blobs`` row per
        # content hash, however many messages and sessions name them; ``session_blobs`` the
        # sessions naming them (``seq``: the order they were stored in). The bytes are stored
        # out of line and uncompressed (STORAGE EXTERNAL): images and PDFs are compressed
        # already, and pglz would only spend CPU finding that out.
        "0009_media",
        [
            """CREATE TABLE blobs (
                ref TEXT PRIMARY KEY,
                media_type TEXT NOT NULL,
                size BIGINT NOT NULL,
                created_at DOUBLE PRECISION NOT NULL,
                data BYTEA NOT NULL
            )""",
            "ALTER TABLE blobs ALTER COLUMN data SET STORAGE EXTERNAL",
            """CREATE TABLE session_blobs (
                session_id TEXT NOT NULL,
                ref TEXT NOT NULL,
                seq BIGINT GENERATED ALWAYS AS IDENTITY,
                PRIMARY KEY (session_id, ref)
            )""",
            "CREATE INDEX session_blobs_ref ON session_blobs (ref)",
        ],
    ),
]


def _append_numbering_forks() -> str:
    """``loom_append`` (0004) again, numbering a fork's first own message and event at its
    share (migration 0010): the rest of the function is unchanged."""
    (text,) = (sql for name, sqls in MIGRATIONS if name == "0004_append_function" for sql in sqls)
    out = text.replace("CREATE FUNCTION loom_append(", "CREATE OR REPLACE FUNCTION loom_append(")
    for table, column in (("messages", "shared_messages"), ("events", "shared_events")):
        old = f"SELECT coalesce(max(seq) + 1, 0) INTO n FROM {table}"
        assert old in out
        out = out.replace(
            old,
            f"SELECT coalesce(max(seq) + 1, (SELECT {column} FROM sessions "
            f"WHERE id = p_session), 0) INTO n FROM {table}",
        )
    return out


MIGRATIONS.append(
    (
        # Forks share their history (issue #28, as SQLite's 0010): a fork's row names its
        # parent and what it shares; its own rows sit at their absolute positions from there
        # on (``postgres_branches``); ``branches`` counts the session's rewinds.
        "0010_session_forks",
        [
            "ALTER TABLE sessions ADD COLUMN parent_id TEXT, "
            "ADD COLUMN shared_messages BIGINT NOT NULL DEFAULT 0, "
            "ADD COLUMN shared_events BIGINT NOT NULL DEFAULT 0, "
            "ADD COLUMN branches BIGINT NOT NULL DEFAULT 0",
            "CREATE INDEX sessions_parent ON sessions (parent_id) WHERE parent_id IS NOT NULL",
            _append_numbering_forks(),
        ],
    )
)
MIGRATIONS.append(
    (
        # Memory across sessions (issue #29, as SQLite's 0011): owned items in namespaces (the
        # parts joined by '.', which no part holds), with a generated ``tsvector`` of the
        # value's text and its GIN index for keyword search (``postgres_items``).
        "0011_items",
        [
            "CREATE TABLE items (namespace TEXT NOT NULL, key TEXT NOT NULL, "
            "value JSONB NOT NULL, owner TEXT, created_at DOUBLE PRECISION NOT NULL, "
            "updated_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION, "
            "words TSVECTOR GENERATED ALWAYS AS (to_tsvector('simple', value::text)) STORED, "
            "PRIMARY KEY (namespace, key))",
            "CREATE INDEX items_words ON items USING GIN (words)",
            "CREATE INDEX items_owner ON items (owner) WHERE owner IS NOT NULL",
            "CREATE INDEX items_namespace ON items (namespace text_pattern_ops)",
        ],
    )
)
# Budgets shared by a fleet (issue #31, as SQLite's 0012; ``loom.budgets``, ``budget_sql``).
MIGRATIONS.append(("0012_budgets", budget_sql.POSTGRES))
MIGRATIONS.append(
    (
        # Semantic search of items (issue #29, as SQLite's 0013): each indexed item's unit
        # vector as real[] beside the embedder that made it (NULL: pending), deleted with its
        # item by the foreign key, in the item's transaction (``postgres_items``).
        "0013_item_vectors",
        [
            "CREATE TABLE item_vectors (namespace TEXT NOT NULL, key TEXT NOT NULL, "
            "fields JSONB, embedder TEXT, dims INTEGER, vector REAL[], "
            "PRIMARY KEY (namespace, key), FOREIGN KEY (namespace, key) "
            "REFERENCES items (namespace, key) ON DELETE CASCADE)",
            "CREATE INDEX item_vectors_pending ON item_vectors (namespace, key) "
            "WHERE vector IS NULL",
            "CREATE INDEX item_vectors_model ON item_vectors (embedder, dims) "
            "WHERE vector IS NOT NULL",
        ],
    )
)
SCHEMA_VERSION = len(MIGRATIONS)

CREATE_MIGRATIONS = (
    "CREATE TABLE IF NOT EXISTS loom_migrations (version INTEGER PRIMARY KEY, "
    "name TEXT NOT NULL UNIQUE, applied_at DOUBLE PRECISION NOT NULL)"
)
HAS_MIGRATIONS = "SELECT to_regclass('loom_migrations') IS NOT NULL"
APPLIED = "SELECT version, name FROM loom_migrations ORDER BY version"

# A session's message count and last change come from its last message row (as on SQLite).
SESSION_SELECT = (
    "SELECT s.id, s.agent_name, s.created_at, greatest(s.updated_at, coalesce(m.appended_at, 0)) "
    "AS changed, coalesce(m.seq + 1, s.shared_messages), s.input_tokens, s.output_tokens, "
    "s.requests, s.metadata, s.branches "
    "FROM sessions s LEFT JOIN LATERAL (SELECT seq, appended_at FROM messages "
    "WHERE session_id = s.id ORDER BY seq DESC LIMIT 1) m ON true"
)


def chain(shared: str) -> str:
    """The segments of session ``%(sid)s`` (``codec.segments``) as a recursive CTE ``chain``
    (id, lo, hi): the session and its ancestors, each with the positions of its own rows the
    session reads (``shared``: ``shared_messages`` or ``shared_events``). The segments are
    disjoint, so one join ordered by ``seq`` reads them in order; a session that is no fork
    is one segment, its whole key range."""
    return (
        "WITH RECURSIVE chain (id, parent_id, lo, hi, depth) AS ("
        f"SELECT id, parent_id, {shared}, NULL::BIGINT, 0 FROM sessions WHERE id = %(sid)s "
        f"UNION ALL SELECT s.id, s.parent_id, s.{shared}, least(c.hi, c.lo), c.depth + 1 "
        "FROM chain c JOIN sessions s ON s.id = c.parent_id WHERE c.depth < 1000) "
    )


def chain_rows(
    shared: str,
    table: str,
    cols: str,
    where: str = "",
    tail: str = "ORDER BY x.seq",
    head: str = "",
) -> str:
    """``cols`` of ``table``'s rows of session ``%(sid)s`` at positions ``%(start)s`` <= seq <
    ``%(stop)s``, across the sessions it shares rows with (``chain``), ``where`` applying to
    each. Each segment is its own range seek on the key: a LATERAL subquery, kept one by
    ``OFFSET 0`` (a plain join let the planner, guessing the chain's size, hash-join a scan of
    the whole table); ``where`` is inside it, so a partial index still fits."""
    return (
        chain(shared)
        + f"{head}SELECT {cols} FROM chain c CROSS JOIN LATERAL (SELECT * FROM {table} "
        "WHERE session_id = c.id AND seq >= greatest(c.lo, %(start)s) "
        f"AND seq < least(c.hi, %(stop)s) {where} OFFSET 0) x {tail}"
    )


NO_STOP = 2**63 - 1
# INTAKE reads: range seeks on the (session_id, seq) primary key (of each session a fork
# shares rows with).
LOAD_MESSAGES = chain_rows("shared_messages", "messages", "x.data")
MESSAGE_COUNT = (
    "SELECT coalesce((SELECT max(seq) + 1 FROM messages WHERE session_id = %(sid)s), "
    "(SELECT shared_messages FROM sessions WHERE id = %(sid)s), 0)"
)
EVENT_COUNT = (
    "SELECT coalesce((SELECT max(seq) + 1 FROM events WHERE session_id = %(sid)s), "
    "(SELECT shared_events FROM sessions WHERE id = %(sid)s), 0)"
)
EVENTS_END = (
    "SELECT (SELECT max(seq) FROM events WHERE session_id = %s), "
    "(SELECT parent_id FROM sessions WHERE id = %s)"
)
LOAD_SYSTEM_MESSAGES = chain_rows(
    "shared_messages", "messages", "x.seq, x.data", "AND role = 'system'"
)
LOAD_TOOL_MESSAGES = chain_rows("shared_messages", "messages", "x.data", "AND role = 'tool'")
COPY_MESSAGES = chain_rows(
    "shared_messages",
    "messages",
    "%(to)s, x.seq, x.role, x.data, x.appended_at",
    tail="",
    head="INSERT INTO messages (session_id, seq, role, data, appended_at) ",
)
EVENT_COLS = "run_id, sequence, type, iteration, timestamp, data"


def load_events(where: str = "", tail: str = "ORDER BY x.seq") -> str:
    """The journal rows (``EVENT_COLS``) of session ``%(sid)s`` across its chain."""
    cols = ", ".join(f"x.{c.strip()}" for c in EVENT_COLS.split(","))
    return chain_rows("shared_events", "events", cols, where, tail)


LEDGER_COLS = "run_id, tool_call_id, name, status, effect, arguments, result, timestamp"
RUN_COLS = "run_id, status, input_tokens, output_tokens, requests, timestamp, data"

# -- one append -----------------------------------------------------------------------------------
# ``loom_append`` (migration 0003) in one statement; ``%b``: binary parameters, so psycopg
# sends the text arrays as they are instead of quoting every element for the text format.
# Each parameter is cast: psycopg types a list of small ints as smallint[], for instance.
_APPEND_TYPES = (
    *("text", "text", "float8", "int8", "int8[]"),  # session, id, now, token, usage
    *("text[]", "text[]"),  # messages
    *("text[]", "int8[]", "text[]", "int8[]", "float8[]", "text[]"),  # events
    *(["text[]"] * 7 + ["float8[]"]),  # ledger
    *("text", "text", "int8", "int8", "int8", "float8", "text"),  # run
)
APPEND = "SELECT loom_append(" + ", ".join(f"%b::{t}" for t in _APPEND_TYPES) + ")"
# ``loom_append_many`` (migration 0008): a batch of appends; answers one status a member.
_APPEND_MANY_TYPES = (
    *("text[]", "text[]", "float8[]", "int8[]", "int8[]"),  # sessions, ids, nows, tokens, usage
    *("int8[]", "int8[]", "int8[]"),  # end offsets of each member's messages, events, ledger
    *_APPEND_TYPES[5:21],  # the row arrays, every member's concatenated
    *("text[]", "text[]", "int8[]", "int8[]", "int8[]", "float8[]", "text[]"),  # run records
)
APPEND_MANY = "SELECT loom_append_many(" + ", ".join(f"%b::{t}" for t in _APPEND_MANY_TYPES) + ")"
# The lock rows of the sessions whose batch members were fenced (for LeaseLost's message).
LEASE_ROWS = "SELECT session_id, token, released, run_id FROM locks WHERE session_id = ANY(%s)"

# -- leases -------------------------------------------------------------------------------------
# One statement: take the row when it is free (released, expired, or this run's), with the
# next token. The clock is the database's, one clock for every host of a fleet.
ACQUIRE_LEASE = (
    "WITH n AS (SELECT extract(epoch FROM clock_timestamp())::float8 AS now) "
    "INSERT INTO locks (session_id, run_id, host, pid, acquired_at, expires_at, token, released) "
    "SELECT %s, %s, %s, %s, n.now, n.now + %s, 1, false FROM n "
    "ON CONFLICT (session_id) DO UPDATE SET run_id = excluded.run_id, host = excluded.host, "
    "pid = excluded.pid, acquired_at = excluded.acquired_at, expires_at = excluded.expires_at, "
    "token = locks.token + 1, released = false "
    "WHERE locks.released OR locks.run_id = excluded.run_id "
    "OR locks.expires_at <= excluded.acquired_at "
    "RETURNING token, expires_at"
)
RENEW_LEASE = (
    "UPDATE locks SET expires_at = extract(epoch FROM clock_timestamp())::float8 + %s "
    "WHERE session_id = %s AND token = %s AND NOT released RETURNING expires_at"
)
RELEASE_LEASE = "UPDATE locks SET released = true WHERE session_id = %s AND token = %s"
LEASE_ROW = "SELECT token, released, run_id FROM locks WHERE session_id = %s"

# Every table with rows that belong to one session (not locks: tokens must keep growing).
SESSION_TABLES = (
    "messages",
    "events",
    "ledger",
    "open_calls",
    "open_runs",
    "runs",
    "errors",
    "results",
    "appends",
)

# -- media (``postgres_media``) ------------------------------------------------------------------
# A put and a session's deletion may race on the same bytes: the put share-locks the rows it
# finds (and inserts those it does not), the deletion locks them for update before deleting the
# ones no session names any more. Whichever locks first wins cleanly: a put that waited finds a
# deleted row gone and writes it again; a deletion that waited sees the put's link (its DELETE
# is a new statement, with a new snapshot) and keeps the bytes. Rows are locked in ``ref`` order.
BLOBS_HELD = "SELECT ref FROM blobs WHERE ref = ANY(%s) ORDER BY ref FOR SHARE"
PUT_BLOB = (
    "INSERT INTO blobs (ref, media_type, size, created_at, data) VALUES (%s, %s, %s, %s, %b) "
    "ON CONFLICT (ref) DO NOTHING"
)
LINK_BLOBS = (
    "INSERT INTO session_blobs (session_id, ref) SELECT %s, t.ref "
    "FROM unnest(%s::text[]) WITH ORDINALITY AS t(ref, ord) ORDER BY t.ord "
    "ON CONFLICT (session_id, ref) DO NOTHING"
)
LOAD_BLOBS = "SELECT ref, data FROM blobs WHERE ref = ANY(%s)"
SESSION_BLOBS = (
    "SELECT l.ref, b.media_type, b.size FROM session_blobs l JOIN blobs b ON b.ref = l.ref "
    "WHERE l.session_id = %s ORDER BY l.seq"
)
UNLINK_SESSION_BLOBS = "DELETE FROM session_blobs WHERE session_id = %s RETURNING ref"
LOCK_BLOBS = "SELECT ref FROM blobs WHERE ref = ANY(%s) ORDER BY ref FOR UPDATE"
DELETE_UNNAMED_BLOBS = (
    "DELETE FROM blobs WHERE ref = ANY(%s) "
    "AND NOT EXISTS (SELECT 1 FROM session_blobs l WHERE l.ref = blobs.ref)"
)
BLOB_USAGE = "SELECT count(*), coalesce(sum(size), 0) FROM blobs"

# -- operations (``loom db status``) -------------------------------------------------------------
STATUS_COUNTS = (
    "SELECT (SELECT count(*) FROM sessions), (SELECT count(*) FROM open_runs), "
    "(SELECT count(*) FROM locks WHERE NOT released "
    "AND expires_at > extract(epoch FROM clock_timestamp())::float8)"
)
# -- items (``postgres_items``) --------------------------------------------------------------
ITEM_COLS = "i.namespace, i.key, i.value, i.owner, i.created_at, i.updated_at, i.expires_at"
# Insert, or replace when the caller may: the key is free, expired, the caller's, or the
# caller is ``None`` (admin code, which keeps the held owner). No row back: another owner's.
PUT_ITEM = (
    "INSERT INTO items AS i (namespace, key, value, owner, created_at, updated_at, expires_at) "
    "VALUES (%(ns)s, %(key)s, %(value)s::jsonb, %(owner)s, %(now)s, %(now)s, %(expires)s) "
    "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, "
    "owner = CASE WHEN %(owner)s::text IS NULL THEN i.owner ELSE excluded.owner END, "
    "created_at = CASE WHEN i.expires_at IS NULL OR i.expires_at > %(now)s "
    "THEN i.created_at ELSE excluded.created_at END, "
    "updated_at = excluded.updated_at, expires_at = excluded.expires_at "
    "WHERE %(owner)s::text IS NULL OR i.owner IS NOT DISTINCT FROM %(owner)s "
    "OR (i.expires_at IS NOT NULL AND i.expires_at <= %(now)s) "
    f"RETURNING {ITEM_COLS}"
)
DELETE_OWNER_ITEMS = "DELETE FROM items WHERE owner = %s"  # their vectors: by the foreign key
PURGE_EXPIRED_ITEMS = "DELETE FROM items WHERE expires_at <= %s"  # their vectors: likewise
PUT_ITEM_VECTOR = (
    "INSERT INTO item_vectors (namespace, key, fields, embedder, dims, vector) "
    "VALUES (%s, %s, %s::jsonb, %s, %s, %s::real[]) ON CONFLICT (namespace, key) DO UPDATE SET "
    "fields = excluded.fields, embedder = excluded.embedder, dims = excluded.dims, "
    "vector = excluded.vector"
)
DELETE_ITEM_VECTOR = "DELETE FROM item_vectors WHERE namespace = %s AND key = %s"
# A vector made by another model than (name, dims), if any: four ranges of the (embedder, dims)
# index, each empty when every vector is this model's (no scan of the vectors).
OTHER_ITEM_VECTOR_MODEL = (
    " UNION ALL ".join(
        f"(SELECT embedder, dims FROM item_vectors WHERE vector IS NOT NULL AND {cond} LIMIT 1)"
        for cond in (
            "embedder < %(name)s",
            "embedder > %(name)s",
            "embedder = %(name)s AND dims < %(dims)s",
            "embedder = %(name)s AND dims > %(dims)s",
        )
    )
    + " LIMIT 1"
)
PENDING_ITEM_VECTORS = (
    "SELECT v.namespace, v.key, v.fields, i.value, i.updated_at FROM item_vectors v "
    "JOIN items i ON i.namespace = v.namespace AND i.key = v.key WHERE v.vector IS NULL "
    "AND (i.expires_at IS NULL OR i.expires_at > %s) LIMIT %s"
)
# A pending vector is written only if its item is still the one embedded (same updated_at).
FILL_ITEM_VECTOR = (
    "UPDATE item_vectors v SET embedder = %s, dims = %s, vector = %s::real[] FROM items i "
    "WHERE v.namespace = %s AND v.key = %s AND v.vector IS NULL "
    "AND i.namespace = v.namespace AND i.key = v.key AND i.updated_at = %s"
)
RESET_ITEM_VECTORS = "UPDATE item_vectors SET embedder = NULL, dims = NULL, vector = NULL"

MIGRATIONS_APPLIED = "SELECT version, name, applied_at FROM loom_migrations ORDER BY version"
