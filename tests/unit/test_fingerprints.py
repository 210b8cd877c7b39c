"""Failure fingerprints (app/domain/fingerprints.py): one cause is one fingerprint whatever its
ids, hosts, install paths and line numbers; two code paths are two.

Issue 40, item 10: failure groups split one cause into many. The tracebacks are those the
Python client (``traceback.format_exception``), the TypeScript client (a V8 ``error.stack`` and
its causes) and the Go client (``jobq.WithStack``, a recovered panic) send.
"""

from __future__ import annotations

import re
import timeit

import pytest

from app.domain.bounds import TRACEBACK_MAX_CHARS
from app.domain.fingerprints import (
    FINGERPRINT_FRAMES_MAX,
    Frame,
    culprit,
    failure_fingerprint,
    frames,
)
from tests.failure_scene import CAUSES, JOBS_PER_CAUSE

FINGERPRINT = re.compile(r"^t:[0-9a-f]{32}$")


def _tracebacks(name: str) -> list[str]:
    [cause] = [c for c in CAUSES if c.name == name]
    errors = [cause.error(n) for n in range(JOBS_PER_CAUSE)]
    return [e["traceback"] for e in errors if isinstance(e, dict) and "traceback" in e]


def _python(frames_: list[tuple[str, int, str]], last: str = "KeyError: 'user_8812'") -> str:
    body = "".join(
        f'  File "{file}", line {line}, in {function}\n    do_something()\n'
        for file, line, function in frames_
    )
    return f"Traceback (most recent call last):\n{body}{last}\n"


@pytest.mark.parametrize(
    "name",
    [
        "card declined",
        "mailbox unknown",
        "user missing (sync)",
        "user missing (invoice)",
        "duplicate order",
        "charges API 503",
        "cache refused",
        "ledger refused",
        "amount invalid",
    ],
)
def test_every_job_of_a_cause_has_one_fingerprint(name: str) -> None:
    """Two hosts (other install paths), three releases (other line numbers), a job's own ids
    and addresses in the exception line: one fingerprint."""
    tracebacks = _tracebacks(name)
    assert len(tracebacks) == JOBS_PER_CAUSE
    found = {failure_fingerprint(t) for t in tracebacks}
    assert len(found) == 1
    [fingerprint] = found
    assert fingerprint is not None and FINGERPRINT.match(fingerprint)


def test_the_causes_of_the_scene_have_fingerprints_of_their_own() -> None:
    """Every cause's frames differ, but those of two exception types raised at one place (the
    error type tells them apart) and none read from a message without a traceback."""
    by_cause = {
        cause.name: failure_fingerprint(tracebacks[0])
        for cause in CAUSES
        if (tracebacks := _tracebacks(cause.name))
    }
    assert set(by_cause) == {c.name for c in CAUSES} - {"report missing", "upstream timeout"}
    assert by_cause["amount invalid"] == by_cause["amount mistyped"]
    del by_cause["amount mistyped"]
    assert len(set(by_cause.values())) == len(by_cause)
    assert by_cause["user missing (sync)"] != by_cause["user missing (invoice)"]


def test_python_frames_are_read_with_file_and_function_only() -> None:
    traceback = _tracebacks("duplicate order")[1]
    assert frames(traceback) == [
        Frame("jobq_client/worker.py", "_call", library=True),
        Frame("orders/importer.py", "save_order", library=False),
        Frame("asyncpg/connection.py", "execute", library=True),
        Frame("protocol/protocol.pyx", "bind_execute", library=True),
    ]
    assert culprit(traceback) == "orders/importer.py in save_order"


def test_chained_python_exceptions_count_every_traceback() -> None:
    """``raise ... from`` and an exception raised while handling another: the cause's frames
    are part of the failure, so the same outer error from another inner one is another cause."""

    def chained(inner: str) -> str:
        first = _python([("/srv/app/sync/users.py", 57, inner)])
        second = _python(
            [("/srv/app/sync/handlers.py", 14, "pull")], "RuntimeError: sync failed for 'u1'"
        )
        return f"{first}\nThe above exception was the direct cause of the following exception:\n\n{second}"

    assert [f.function for f in frames(chained("pull_user"))] == ["pull_user", "pull"]
    assert failure_fingerprint(chained("pull_user")) != failure_fingerprint(chained("load_user"))
    assert culprit(chained("pull_user")) == "sync/handlers.py in pull"


def test_an_exception_groups_frames_are_read() -> None:
    traceback = (
        "  + Exception Group Traceback (most recent call last):\n"
        '  |   File "/srv/app/jobs/fanout.py", line 30, in run\n'
        "  |     async with asyncio.TaskGroup() as tg:\n"
        "  | ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)\n"
        "  +-+---------------- 1 ----------------\n"
        "    | Traceback (most recent call last):\n"
        '    |   File "/srv/app/jobs/fanout.py", line 12, in fetch\n'
        "    |     raise TimeoutError(url)\n"
        "    | TimeoutError: https://api.x.com/v1/items?page=7\n"
    )
    assert [(f.file, f.function) for f in frames(traceback)] == [
        ("jobs/fanout.py", "run"),
        ("jobs/fanout.py", "fetch"),
    ]


def test_v8_stacks_are_read_innermost_first_with_their_causes() -> None:
    """A V8 stack lists the innermost frame first; the TypeScript client appends each cause's
    stack after "Caused by:". Line, column, host path and "async" / "[as ...]" do not count."""
    [stack] = _tracebacks("cache refused")[:1]
    assert [f.function for f in frames(stack)] == [
        "Worker.run",
        "renderThumbnail",
        "RedisCache.get",
        "TCPConnectWrap.afterConnect",
    ]
    assert culprit(stack) == "dist/cache.js in RedisCache.get"
    caused = (
        "Error: thumbnail 8812 failed\n"
        "    at renderThumbnail (file:///srv/worker/dist/jobs/thumbnails.js:90:11)\n"
        "    at /srv/worker/dist/jobs/index.js:12:3\n"
        f"Caused by: {stack}"
    )
    assert len(frames(caused)) == 6
    assert failure_fingerprint(caused) != failure_fingerprint(stack)
    assert culprit(caused) == "jobs/thumbnails.js in renderThumbnail"
    moved = caused.replace("thumbnails.js:90:11", "thumbnails.js:97:3").replace("8812", "17")
    assert failure_fingerprint(moved) == failure_fingerprint(caused)


def test_v8_bundle_names_with_build_hashes_are_one_file() -> None:
    def stack(bundle: str) -> str:
        return (
            "TypeError: Cannot read properties of undefined (reading 'id')\n"
            f"    at Object.render (https://cdn.x.com/static/js/{bundle}?v=3:1:23456)\n"
            "    at new Promise (<anonymous>)"
        )

    assert failure_fingerprint(stack("main.3f2a1b9c.chunk.js")) == failure_fingerprint(
        stack("main.77e0d4aa.chunk.js")
    )
    assert frames(stack("main.3f2a1b9c.chunk.js"))[-1].file == "js/main.3f2a1b9c.chunk.js"


def test_go_stacks_are_read_from_the_client_and_from_a_panic() -> None:
    """The Go client's ``WithStack`` format and a recovered panic's (``debug.Stack``): function
    (arguments and goroutine numbers dropped) and file, innermost first."""
    [stack] = _tracebacks("ledger refused")[:1]
    assert culprit(stack) == "ledger/store.go in main.(*Store).Connect"
    panic = (
        "panic: runtime error: index out of range [3] with length 3\n\n"
        "goroutine 7 [running]:\n"
        "main.reconcile({0xc000012345, 0x3}, 0xc00001c0a8)\n"
        "\t/src/ledger/reconcile.go:118 +0x1d\n"
        "github.com/acme/jobq/clients/go.(*Worker).run(0xc0000a6000)\n"
        "\t/home/ci/go/pkg/mod/github.com/acme/jobq/clients/go@v0.4.2/worker.go:205 +0x8f\n"
        "created by github.com/acme/jobq/clients/go.(*Worker).Start in goroutine 1\n"
        "\t/home/ci/go/pkg/mod/github.com/acme/jobq/clients/go@v0.4.2/worker.go:120 +0x2c\n"
    )
    assert [f.function for f in frames(panic)] == [
        "github.com/acme/jobq/clients/go.(*Worker).Start",
        "github.com/acme/jobq/clients/go.(*Worker).run",
        "main.reconcile",
    ]
    assert culprit(panic) == "ledger/reconcile.go in main.reconcile"
    other_goroutine = panic.replace("goroutine 7", "goroutine 9").replace("0xc000012345", "0x1")
    assert failure_fingerprint(other_goroutine) == failure_fingerprint(panic)


def test_line_numbers_and_install_paths_do_not_count_files_and_functions_do() -> None:
    here = _python([("/srv/app/sync/users.py", 57, "pull_user")])
    assert failure_fingerprint(here) == failure_fingerprint(
        _python([("C:\\deploy\\20261207\\sync\\users.py", 61, "pull_user")], "KeyError: 'x'")
    )
    assert failure_fingerprint(here) != failure_fingerprint(
        _python([("/srv/app/sync/users.py", 57, "push_user")])
    )
    assert failure_fingerprint(here) != failure_fingerprint(
        _python([("/srv/app/sync/groups.py", 57, "pull_user")])
    )


def test_a_recursion_is_one_frame_however_deep() -> None:
    def deep(depth: int) -> str:
        return _python(
            [("/srv/app/tree.py", 10, "walk")] * depth + [("/srv/app/tree.py", 4, "leaf")],
            "RecursionError: maximum recursion depth exceeded",
        )

    assert failure_fingerprint(deep(3)) == failure_fingerprint(deep(40))
    assert len(frames(deep(40))) == 2


def test_a_traceback_longer_than_what_is_kept_counts_its_innermost_frames() -> None:
    """Only the last 16,000 characters are kept (Python's exception line is at the end): the
    fingerprint is the stored traceback's, and however deep the call went above the innermost
    frames it takes, the fingerprint is the same."""

    def long(outer: int) -> str:
        # Layer 1 calls pull_user; deeper stacks add layers above it.
        calls = [(f"/srv/app/layer{i}/step.py", i, f"step_{i}") for i in range(outer, 0, -1)]
        return _python([*calls, ("/srv/app/sync/users.py", 57, "pull_user")])

    assert len(long(300)) > TRACEBACK_MAX_CHARS
    kept = long(300)[-TRACEBACK_MAX_CHARS:]
    assert failure_fingerprint(long(300)) == failure_fingerprint(kept)
    assert failure_fingerprint(long(300)) == failure_fingerprint(long(400))
    assert len(frames(kept)) > FINGERPRINT_FRAMES_MAX


@pytest.mark.parametrize(
    "traceback",
    [
        None,
        "",
        "Traceback\nKeyError: 'row-1'",  # no frame: grouped by the message
        "Error: connect ECONNREFUSED 127.0.0.1:6379",  # a stack of its exception line only
        "at the end of the day, at noon (roughly) things fail",
        "File not found: report.csv",
    ],
)
def test_no_frames_no_fingerprint(traceback: str | None) -> None:
    assert failure_fingerprint(traceback) is None
    assert culprit(traceback) is None


def test_hostile_text_is_read_in_linear_time() -> None:
    """The fail path computes fingerprints before it takes a connection: text shaped to make a
    pattern backtrack costs no more than any other text of its length."""
    hostile = [
        "Error: x\n    at " + "f (" * 5_000 + "\n    at " + "a" * 16_000,
        "x\n\t" + ":1" * 8_000,
        'File "' + "a" * 16_000,
        ("main.f(" * 2_000 + "\n\t/x.go:1\n") * 3,
    ]
    for text in hostile:
        seconds = timeit.timeit(lambda text=text: failure_fingerprint(text), number=3) / 3
        assert seconds < 0.05, (text[:40], seconds)
