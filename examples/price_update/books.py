"""The bookstore's ``books`` table: created in its own schema and filled with deterministic prices.

    BOOKS_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/shop python -m examples.price_update.books 2000000

Book ``id`` runs 1..rows with no gaps; its price is :func:`original_price` (5.00 to 104.99, the
same on every run), its ``price_list_version`` is 6. One ``INSERT ... SELECT`` from
``generate_series`` fills it, then the primary key is built, which is faster than maintaining the
index row by row (2,000,000 rows take a few seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from decimal import ROUND_HALF_UP, Decimal

import asyncpg

SCHEMA = "bookstore"
TABLE = f"{SCHEMA}.books"
ROWS_DEFAULT = 2_000_000
START_VERSION = 6

# The price of book g in cents: 500 + (g * 7919) % 10000, i.e. 5.00 .. 104.99, spread evenly.
# Kept in step with original_price() below (the tests check they agree).
_PRICE_SQL = "((500 + (g * 7919) % 10000) / 100.0)::numeric(12, 2)"


def books_dsn() -> str:
    """The books database: ``BOOKS_DATABASE_URL``, else ``DATABASE_URL``, as an asyncpg DSN."""
    url = os.environ.get("BOOKS_DATABASE_URL") or os.environ.get("DATABASE_URL")
    if not url:
        raise RuntimeError("set BOOKS_DATABASE_URL (or DATABASE_URL) to a PostgreSQL URL")
    return asyncpg_dsn(url)


def asyncpg_dsn(url: str) -> str:
    """A SQLAlchemy-style URL (``postgresql+asyncpg://``) as a plain ``postgresql://`` DSN."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme.split('+', 1)[0]}{sep}{rest}"


def original_price(book_id: int) -> Decimal:
    """The price :func:`create_books` gives book ``book_id`` (exact, as PostgreSQL stores it)."""
    return Decimal(500 + (book_id * 7919) % 10000) / 100


def raised_price(price: Decimal, percent: int | str | Decimal) -> Decimal:
    """``round(price * (1 + percent / 100), 2)`` with PostgreSQL's rounding (half away from zero)."""
    factor = 1 + Decimal(str(percent)) / 100
    return (price * factor).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


def expected_total(rows: int, percent: int | str | Decimal) -> Decimal:
    """The sum of every book's price once each of books 1..rows was raised exactly once."""
    return sum((raised_price(original_price(i), percent) for i in range(1, rows + 1)), Decimal(0))


async def create_books(conn: asyncpg.Connection, rows: int = ROWS_DEFAULT) -> None:
    """(Re)creates ``bookstore.books`` with ``rows`` books at version 6, then analyzes it."""
    await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    await conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
    await conn.execute(
        f"CREATE TABLE {TABLE} ("
        " id bigint NOT NULL,"
        " price numeric(12, 2) NOT NULL,"
        " price_list_version int NOT NULL)"
    )
    await conn.execute(
        f"INSERT INTO {TABLE} (id, price, price_list_version)"
        f" SELECT g, {_PRICE_SQL}, {START_VERSION} FROM generate_series(1, $1::bigint) AS g",
        rows,
    )
    await conn.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT books_pkey PRIMARY KEY (id)")
    await conn.execute(f"VACUUM ANALYZE {TABLE}")


async def version_counts(conn: asyncpg.Connection) -> dict[int, int]:
    """How many books are at each price-list version."""
    rows = await conn.fetch(
        f"SELECT price_list_version, count(*) AS n FROM {TABLE} GROUP BY 1 ORDER BY 1"
    )
    return {r["price_list_version"]: r["n"] for r in rows}


async def _main(rows: int) -> None:
    conn = await asyncpg.connect(books_dsn())
    try:
        await create_books(conn, rows)
        print(f"{TABLE}: {rows} books, versions {await version_counts(conn)}")
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    """Command line: create and fill the table."""
    parser = argparse.ArgumentParser(description="create and fill bookstore.books")
    parser.add_argument("rows", nargs="?", type=int, default=ROWS_DEFAULT)
    args = parser.parse_args(argv)
    asyncio.run(_main(args.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
