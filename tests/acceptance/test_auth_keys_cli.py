"""``jobq keys``: the secret alone on stdout, listings without secrets, revocation, bad input, no database."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.auth.keys import digest
from tests.processes import clean_environment

SECRET = re.compile(r"^jobq_[0-9]+_[A-Za-z0-9_-]{43}$")


def jobq(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "keys", *args],
        env=clean_environment({"DATABASE_URL": database_url}),
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_create_prints_the_secret_alone_and_stores_only_its_hash(
    database_url: str, clean_db: AsyncEngine
) -> None:
    made = jobq(
        database_url,
        "create",
        "--role",
        "worker",
        "--name",
        "mailer",
        "--queues",
        "emails,billing.*",
    )
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert made.stdout == secret + "\n"
    assert SECRET.match(secret)
    assert "mailer" in made.stderr and secret not in made.stderr
    async with clean_db.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT role, queues, secret_sha256 FROM api_keys WHERE name = 'mailer'")
            )
        ).one()
        dump = str(
            (await conn.execute(text("SELECT row_to_json(k)::text FROM api_keys k"))).scalar()
        )
    assert row.role == "worker"
    assert row.queues == ["emails", "billing.*"]
    assert bytes(row.secret_sha256) == digest(secret)
    assert secret not in dump and secret.split("_")[-1] not in dump

    listed = jobq(database_url, "list")
    assert listed.returncode == 0
    assert "mailer" in listed.stdout and "emails,billing.*" in listed.stdout
    assert secret not in listed.stdout and secret.split("_")[-1] not in listed.stdout

    assert jobq(database_url, "revoke", "mailer").returncode == 0
    again = jobq(database_url, "revoke", "mailer")
    assert again.returncode == 1 and "no live key" in again.stderr
    assert jobq(database_url, "list").stdout.count("mailer") == 1  # still listed, as revoked


async def test_bad_names_scopes_and_taken_names_are_refused(
    database_url: str, clean_db: AsyncEngine
) -> None:
    assert jobq(database_url, "create", "--role", "admin", "--name", "ops").returncode == 0
    taken = jobq(database_url, "create", "--role", "admin", "--name", "ops")
    assert taken.returncode == 1 and "exists already" in taken.stderr and taken.stdout == ""
    bad_scope = jobq(
        database_url, "create", "--role", "worker", "--name", "w", "--queues", "a;drop"
    )
    assert bad_scope.returncode == 2 and "--queues" in bad_scope.stderr
    bad_name = jobq(database_url, "create", "--role", "worker", "--name", "-x y")
    assert bad_name.returncode == 2
    bad_role = jobq(database_url, "create", "--role", "root", "--name", "r")
    assert bad_role.returncode == 2
    async with clean_db.connect() as conn:
        names = (await conn.execute(text("SELECT array_agg(name) FROM api_keys"))).scalar()
    assert names == ["ops"]


@pytest.mark.parametrize(
    "command",
    [["create", "--role", "admin", "--name", "ops"], ["list"], ["revoke", "ops"]],
    ids=["create", "list", "revoke"],
)
def test_with_no_database_the_key_commands_stop_and_make_no_cluster(
    tmp_path: Path, command: list[str]
) -> None:
    env = clean_environment()
    for name in ("DATABASE_URL", "DIRECT_DATABASE_URL"):
        env.pop(name, None)

    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "keys", *command],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert str(tmp_path.resolve() / ".jobq" / "pgdata") in done.stderr
    assert "DATABASE_URL" in done.stderr and "JOBQ_DATA_DIR" in done.stderr
    assert list(tmp_path.iterdir()) == []  # no data folder, no cluster made behind the user's back


async def test_webhook_secret_prints_the_keys_signing_secret_and_rotates_it(
    database_url: str, clean_db: AsyncEngine
) -> None:
    made = jobq(database_url, "create", "--role", "producer", "--name", "shop")
    assert made.returncode == 0, made.stderr
    assert "jobq keys webhook-secret shop" in made.stderr
    shown = jobq(database_url, "webhook-secret", "shop")
    assert shown.returncode == 0, shown.stderr
    secret = shown.stdout.strip()
    assert shown.stdout == secret + "\n" and re.match(r"^whsec_[0-9a-f]{64}$", secret)
    rotated = jobq(database_url, "webhook-secret", "shop", "--rotate")
    assert rotated.returncode == 0, rotated.stderr
    new = rotated.stdout.strip()
    assert new != secret and secret in rotated.stderr  # the previous one, still signing a while
    assert jobq(database_url, "webhook-secret", "shop").stdout.strip() == new
    missing = jobq(database_url, "webhook-secret", "nobody")
    assert missing.returncode == 1 and "no live key named 'nobody'" in missing.stderr
    async with clean_db.connect() as conn:
        actions = (
            await conn.execute(
                text("SELECT action, key_name FROM audit_log WHERE key_name = 'shop' ORDER BY id")
            )
        ).all()
    assert [tuple(a) for a in actions] == [
        ("key.create", "shop"),
        ("key.rotate_webhook_secret", "shop"),
    ]
