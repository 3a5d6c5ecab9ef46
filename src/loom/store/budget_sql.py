"""The budget tables (issue #31, ``loom.budgets``): DDL for SQLite and PostgreSQL.

``budget_spend`` holds one row per budget bucket (a limit's scope, its subject and its window
start): what was spent and what in-flight model calls reserved, in integer nano-dollars and
tokens, so a conditional ``UPDATE ... WHERE spent + reserved + x <= limit`` is exact and atomic
on both engines. ``budget_reservations`` holds each in-flight reservation with its expiry, so a
process that died between reserving and reconciling cannot hold budget for ever. ``warned``
records that the bucket's warning was sent (once per window).

The statements themselves are ``loom.budgets``'s; they run through the store's
``ScheduleTables`` seam (its generic SQL channel), so the store keeps its connections.
"""

from __future__ import annotations

__all__ = ["POSTGRES", "SQLITE"]


def _ddl(float_type: str) -> list[str]:
    return [
        "CREATE TABLE budget_spend ("
        "bucket TEXT NOT NULL, window_start TEXT NOT NULL, "
        "scope TEXT NOT NULL, subject TEXT NOT NULL, period TEXT NOT NULL, "
        "spent_nanos BIGINT NOT NULL DEFAULT 0, spent_tokens BIGINT NOT NULL DEFAULT 0, "
        "reserved_nanos BIGINT NOT NULL DEFAULT 0, reserved_tokens BIGINT NOT NULL DEFAULT 0, "
        "warned INTEGER NOT NULL DEFAULT 0, "
        f"updated_at {float_type} NOT NULL, "
        "PRIMARY KEY (bucket, window_start))",
        "CREATE TABLE budget_reservations ("
        "reservation_id TEXT NOT NULL, bucket TEXT NOT NULL, window_start TEXT NOT NULL, "
        "nanos BIGINT NOT NULL, tokens BIGINT NOT NULL, "
        f"expires_at {float_type} NOT NULL, "
        "PRIMARY KEY (reservation_id, bucket, window_start))",
        "CREATE INDEX budget_reservations_bucket ON budget_reservations "
        "(bucket, window_start, expires_at)",
    ]


SQLITE = ";".join(_ddl("REAL"))
POSTGRES = _ddl("DOUBLE PRECISION")
