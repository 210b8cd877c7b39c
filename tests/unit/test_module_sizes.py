"""No module in app/ grows past about 500 lines: a feature that needs more is a room of its own.

The exceptions are named here with their reason; a module that shrinks below the limit leaves
the list (the test says so), and a new one cannot join it silently.
"""

from __future__ import annotations

from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"
LIMIT = 500

# Module -> why it stays whole (checked against its current size, with a little room).
EXCEPTIONS: dict[str, tuple[int, str]] = {
    # The wire models of the whole API, one contract with openapi.json; splitting them by
    # resource would scatter the shared field rules (queue names, bounds, strict types).
    "api/schemas.py": (560, "the API's wire models, one contract"),
    # Schedule definitions and the scheduler's pass share the lock-then-audit helpers and the
    # row-to-timing conversions; the pure cron arithmetic is app/domain/cron.py already.
    "queue/schedules.py": (650, "definitions and the pass share their locked writes"),
    # The hot path kept in one place on purpose: enqueue, claim (with its limit retries and
    # long-poll parking) and the lease transitions are what the benchmark measures.
    # A batch's callback joins the batch's own transaction there (issue 21); what a claim
    # hands a job about its parents is app/queue/linked.py (the claiming key's scopes pass
    # through to it, issue 40); the lanes that keep its limited statements one at a time are
    # app/queue/coalesce.py; the claimed jobs no worker could read, failed at once, are
    # app/queue/handoff.py (issue 40).
    "queue/jobs.py": (630, "the hot path, read and profiled as one"),
    # Cron parsing, DST-aware next-run arithmetic and catch-up plans: pure and tested whole.
    "domain/cron.py": (530, "cron arithmetic, pure"),
    # Every setting in one class, grouped by area: the one source of each default, of the
    # configuration reference and of the bounds OpenAPI shows (STYLE rule 12); split, it would be several.
    "settings.py": (560, "every setting and its default, one source"),
}


def _sizes() -> dict[str, int]:
    return {
        str(path.relative_to(APP)): len(path.read_text(encoding="utf-8").splitlines())
        for path in APP.rglob("*.py")
    }


def test_no_module_grows_past_the_limit_unless_named() -> None:
    over = {
        name: lines
        for name, lines in _sizes().items()
        if lines > LIMIT and lines > EXCEPTIONS.get(name, (0, ""))[0]
    }
    assert over == {}, f"modules over {LIMIT} lines (split them, or name them here): {over}"


def test_every_exception_is_still_needed() -> None:
    sizes = _sizes()
    stale = [name for name in EXCEPTIONS if sizes.get(name, 0) <= LIMIT]
    assert stale == [], f"no longer over {LIMIT} lines, drop them from EXCEPTIONS: {stale}"
