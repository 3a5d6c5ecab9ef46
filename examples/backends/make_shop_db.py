"""Build examples/backends/shop.db from shop.sql: ``python examples/backends/make_shop_db.py``."""

from __future__ import annotations

import sqlite3
from pathlib import Path

HERE = Path(__file__).parent


def make(path: Path = HERE / "shop.db") -> Path:
    """(Re)create the sample database at ``path`` and return it."""
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as conn:
        conn.executescript((HERE / "shop.sql").read_text())
    return path


if __name__ == "__main__":
    print(make())
