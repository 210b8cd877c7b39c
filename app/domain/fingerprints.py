"""Failure fingerprints: what makes two failures one cause, as error trackers (Sentry, Rollbar)
group them.

A failure that carries a traceback is one cause with another of the same error type whose
traceback has the same frames: each frame's file and function, with no line numbers and no
values. The file is its last two path components with digit-holding parts masked, so another
host's install path, a release folder, a moved line or another job's ids keep one cause one
group, while the same message raised from two code paths is two. Python tracebacks, JavaScript
(V8: Node, Deno, Bun) stacks and Go stacks (a panic's, ``jobq.WithStack``'s, or one formatted by
``github.com/pkg/errors``) are read, chained causes included.

A failure without a traceback, or with one holding no frame read here, is grouped by its
message with every token holding a digit or a quoted value masked; PostgreSQL does that when
failures are read (``jobq_failure_pattern``, app/store/sql/schema/helpers.sql), for failures
of any age.

Pure: the fail path computes the fingerprint before it takes a connection, and it is stored in
the failure's history event, so grouping is a GROUP BY on a stored value.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass

from app.domain.bounds import TRACEBACK_MAX_CHARS

# Frames taken into a fingerprint, the innermost first: a traceback cut to its kept part (a
# deep one) keeps them all, so how deep the recursion above them went does not matter.
FINGERPRINT_FRAMES_MAX = 30
FINGERPRINT_PREFIX = "t:"

# One pattern per format, each opening with a literal the scan can look for (a pattern opening
# with a MULTILINE ^ tries every position of a 16,000-character traceback).
# Python: '  File "/srv/app/billing/payments.py", line 88, in charge' (an exception group's
# frames are prefixed with "| ").
_PYTHON = re.compile(r'File "([^"\n]+)", line [0-9]+(?:, in ([^\n]*))?')
# V8 (Node, Deno, Bun): "    at RedisCache.get (/srv/worker/dist/cache.js:41:17)", or for an
# anonymous function "    at /srv/worker/dist/cache.js:41:17"; the line is split in Python (a
# pattern splitting it would backtrack over every " (" of a hostile line).
_V8 = re.compile(r"\n[ \t]+at ([^\n]+)")
# Go: a function line ("main.(*Store).Connect(0xc000012345, ...)", "created by main.main in
# goroutine 1") above a tab-indented "/src/ledger/store.go:57 +0x1d".
_GO_FILE = re.compile(r"\n\t([^\n]+?):[0-9]+(?: \+0x[0-9a-f]+)?[ \t]*(?=\n|$)")
_GO_NOISE = re.compile(r"^created by |\([^()]*\)$| in goroutine [0-9]+$")
_V8_NOISE = re.compile(r"^(?:async |new )+| \[as [^\]]*\]$")
_LINE_COLUMN = re.compile(r":[0-9]+(?::[0-9]+)?$")
_SCHEME_HOST = re.compile(r"^[a-z][a-z0-9+.-]*://[^/]*", re.IGNORECASE)
_PATH_SEPARATOR = re.compile(r"[/\\]+")
# A run of hex characters holding a digit: a version, a build hash, a release stamp.
_DIGITS = re.compile(r"[0-9a-f]*[0-9][0-9a-f]*", re.IGNORECASE)
# Where libraries and runtimes live, for the culprit only (the fingerprint takes every frame).
_LIBRARY = re.compile(
    r"site-packages|dist-packages|node_modules|^node:|^<|[/\\]lib[/\\]python[0-9]"
    r"|\.pyx$|/go/src/|/pkg/mod/|^native$|^index ",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame of a traceback: its file (the last two path components) and function."""

    file: str
    function: str
    library: bool  # in an installed package or the runtime, not the application's own code


# Locations longer than this are not cached: the cache holds the few hundred of a deployment's
# code, and no sender can fill it with long text.
_CACHED_LOCATION_MAX = 300


def _where_of(location: str) -> tuple[str, str, bool]:
    """A frame's location as its file (the last two path components, without line, column, URL
    host or query), that file with digit-holding parts masked, and whether it is a library's."""
    location = location.strip()
    path = _SCHEME_HOST.sub("", _LINE_COLUMN.sub("", location))
    path = path.split("?", 1)[0].split("#", 1)[0]
    file = "/".join([part for part in _PATH_SEPARATOR.split(path) if part][-2:])
    return file, _DIGITS.sub("#", file), bool(_LIBRARY.search(location))


# The same few hundred locations recur in every failure of a deployment.
_where_cached = functools.lru_cache(maxsize=4096)(_where_of)


def _where(location: str) -> tuple[str, str, bool]:
    return _where_cached(location) if len(location) <= _CACHED_LOCATION_MAX else _where_of(location)


def _v8(line: str) -> tuple[str, str] | None:
    """A V8 frame line after its "at " as (location, function); ``None`` when it is none."""
    line = line.rstrip()
    if line.endswith(")"):
        opened = line.find(" (")
        if opened > 0:
            return line[opened + 2 : -1], _V8_NOISE.sub("", line[:opened]).strip()
    bare = line.removeprefix("async ")
    if " " not in bare and _LINE_COLUMN.search(bare):
        return bare, ""
    return None


def _raw(traceback: str) -> list[tuple[str, str]]:
    """The (location, function) of each frame, innermost last (a V8 or Go stack lists its
    innermost frame first: reversed). The first format with a frame wins."""
    text = traceback[-TRACEBACK_MAX_CHARS:]
    python = _PYTHON.findall(text)
    if python:
        return [(file, function.strip()) for file, function in python]
    v8 = [frame for frame in map(_v8, _V8.findall(text)) if frame is not None]
    if v8:
        return v8[::-1]
    go = []
    for match in _GO_FILE.finditer(text):
        above = text[text.rfind("\n", 0, match.start()) + 1 : match.start()]
        if above and not above[0].isspace():
            go.append((match[1], _GO_NOISE.sub("", above).strip()))
    return go[::-1]


def frames(traceback: str) -> list[Frame]:
    """The frames of a traceback (Python, V8 or Go), innermost last; consecutive repeats (a
    recursion) are taken once."""
    found: list[Frame] = []
    for location, function in _raw(traceback):
        file, _, library = _where(location)
        frame = Frame(file, function, library)
        if not found or found[-1] != frame:
            found.append(frame)
    return found


def failure_fingerprint(traceback: str | None) -> str | None:
    """The fingerprint of a traceback's frames (``t:`` and 32 hex digits): its innermost
    ``FINGERPRINT_FRAMES_MAX`` frames, each as its masked file and function, consecutive repeats
    once. ``None`` when there is no traceback or no frame in it: the message groups it then."""
    if not traceback:
        return None
    keys: list[str] = []
    for location, function in reversed(_raw(traceback)):
        key = f"{_where(location)[1]} {function}"
        if not keys or keys[-1] != key:
            keys.append(key)
            if len(keys) == FINGERPRINT_FRAMES_MAX:
                break
    if not keys:
        return None
    digest = hashlib.blake2b("\n".join(keys).encode("utf-8", "backslashreplace"), digest_size=16)
    return FINGERPRINT_PREFIX + digest.hexdigest()


def culprit(traceback: str | None) -> str | None:
    """Where a failure was raised, for people: the innermost frame of the application's own
    code (else the innermost frame) as ``file in function``; ``None`` without frames."""
    found = frames(traceback) if traceback else []
    if not found:
        return None
    frame = next((f for f in reversed(found) if not f.library), found[-1])
    return f"{frame.file} in {frame.function}" if frame.function else frame.file
