"""The code blocks of README.md and docs/**/*.md, read the way a reader reads them.

Pure helpers (no service, no database) for ``tests/acceptance/test_readme_examples.py``, which
runs every block against a live ``jobq serve``, and for their unit tests:

- :func:`document_blocks` finds every code block (fenced or indented) with CommonMark's own
  rules (markdown-it-py, as GitHub renders them), its language, its line and the marker on the
  line before it: ``<!-- example: not run (why) -->``.
- :func:`shell_commands` splits a shell block into commands, each with the ``# -> 201 {...}``
  comment that states its answer.
- :func:`parse_curl` reads a ``curl`` command's method, URL, headers and body.
- :func:`relaxed_json` reads the answers the README shows, where ``...`` (or ``…``) stands for
  "more fields" in an object and "more items" in a list; :func:`mismatches` compares such an
  answer with the real one, with ids mapped through an :class:`IdMap` and times checked for type
  only.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]

ELLIPSIS = "\u2026"
MARKER = re.compile(r"^<!--\s*example:\s*(?P<text>.*?)\s*-->$")
NOT_RUN = re.compile(r"^not run \((?P<why>\S.*)\)$")
ASSIGNMENT = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$", re.DOTALL)
SHELL_OPERATORS = {"&&", "||", "|", ";", "&", ">", ">>", "<"}
PLACEHOLDER = re.compile(r"^<[^<>]+>$")
VARIABLE = re.compile(
    r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))"
)


def documents(root: Path = ROOT) -> list[Path]:
    """The pages whose examples must run: README.md and every docs/**/*.md, in that order."""
    return [root / "README.md", *sorted(root.glob("docs/**/*.md"))]


@dataclass(frozen=True)
class Block:
    """One code block of a page."""

    path: str  # relative to the repository root
    line: int  # 1-based line of the opening fence (of the first line, for an indented block)
    lang: str  # the fence's info string's first word, lower case; "" when none
    text: str  # the content, without the block's own indentation
    marker: str | None  # the text of an ``<!-- example: ... -->`` on the line before, if any
    fenced: bool = True  # False for an indented block

    @property
    def first_line(self) -> str:
        """The first non-empty line of the content, stripped."""
        return next((line.strip() for line in self.text.splitlines() if line.strip()), "")

    @property
    def content_line(self) -> int:
        """The 1-based line of the content's first line in the page."""
        return self.line + 1 if self.fenced else self.line

    @property
    def id(self) -> str:
        """``path:line``, the block's name in test ids and reports."""
        return f"{self.path}:{self.line}"

    def describe(self) -> str:
        """Where it is and how it starts, for failure messages."""
        return f"{self.id} ({self.lang or 'no language'}) `{self.first_line[:80]}`"

    @property
    def not_run_reason(self) -> str | None:
        """The reason of a ``not run (why)`` marker; ``None`` without one."""
        if self.marker is None:
            return None
        found = NOT_RUN.match(self.marker)
        return found.group("why") if found else None


def document_blocks(path: Path, root: Path = ROOT) -> list[Block]:
    """Every code block of one Markdown page, in order."""
    text = path.read_text(encoding="utf-8")
    return blocks_of(text, str(path.relative_to(root)))


def blocks_of(text: str, name: str) -> list[Block]:
    """Every code block of ``text`` (a page called ``name``), in order."""
    lines = text.splitlines()
    found: list[Block] = []
    for token in MarkdownIt("commonmark").parse(text):
        if token.type not in ("fence", "code_block") or token.map is None:
            continue
        start = token.map[0]  # 0-based line of the fence (or of an indented block's first line)
        before = lines[start - 1].strip() if start > 0 else ""
        marker = MARKER.match(before)
        found.append(
            Block(
                path=name,
                line=start + 1,
                lang=(token.info.split() or [""])[0].lower() if token.type == "fence" else "",
                text=token.content,
                marker=marker.group("text") if marker else None,
                fenced=token.type == "fence",
            )
        )
    return found


def all_blocks(root: Path = ROOT) -> list[Block]:
    """Every code block of every page of :func:`documents`."""
    return [block for page in documents(root) for block in document_blocks(page, root)]


# -- shell --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expectation:
    """What a ``# -> STATUS BODY`` comment states: the status and the answer (``None``: unstated)."""

    status: int
    body: Any
    text: str


@dataclass(frozen=True)
class ShellCommand:
    """One command of a shell block (continuation lines joined, comments removed)."""

    line: int  # 0-based line of the block where it starts
    source: str
    expect: Expectation | None = None

    def split(self, variables: Mapping[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
        """Its leading ``NAME=value`` assignments and its words, variables expanded as sh does."""
        words = shlex.split(expand_variables(self.source, variables or {}))
        assignments: dict[str, str] = {}
        while words and (found := ASSIGNMENT.match(words[0])):
            assignments[found.group("name")] = found.group("value")
            words.pop(0)
        return assignments, words

    @property
    def program(self) -> str | None:
        """The command's first word; ``None`` for a line of assignments only."""
        words = self.split()[1]
        return words[0] if words else None

    @property
    def is_simple(self) -> bool:
        """One command: no pipes, lists, redirections or command substitutions."""
        words = self.split()[1]
        return (
            not (set(words) & SHELL_OPERATORS)
            and "$(" not in self.source
            and "`" not in self.source
        )


def strip_comment(text: str) -> tuple[str, bool]:
    """``text`` without a trailing shell comment; whether its quotes are all closed.

    A ``#`` starts a comment only at the start of a word and outside quotes, as in sh.
    """
    out: list[str] = []
    quote: str | None = None
    escaped = False
    previous = " "
    index = 0
    while index < len(text):
        char = text[index]
        if escaped:
            escaped = False
        elif quote is not None:
            if char == quote:
                quote = None
            elif char == "\\" and quote == '"':
                escaped = True
        elif char in "'\"":
            quote = char
        elif char == "\\":
            escaped = True
        elif char == "#" and previous.isspace():
            end = text.find("\n", index)
            if end < 0:
                break
            index = end
            continue
        out.append(char)
        previous = char
        index += 1
    return "".join(out), quote is None


def _balance(text: str) -> int:
    """Open brackets minus closed ones, outside JSON strings."""
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
    return depth


def parse_expectation(text: str) -> Expectation:
    """``201 {"id": 1, ...}`` -> status 201 and the answer, with ``...`` kept as :data:`ELLIPSIS`."""
    found = re.match(r"^\s*(?P<status>\d{3})\b\s*(?P<body>.*)$", text, re.DOTALL)
    if found is None:
        raise ValueError(f"an answer comment must start with a status code: {text!r}")
    body_text = found.group("body").strip()
    body = relaxed_json(body_text) if body_text else None
    return Expectation(int(found.group("status")), body, text.strip())


def shell_commands(text: str) -> list[ShellCommand]:
    """The commands of a shell block, each with the ``# -> ...`` answer comment after it."""
    lines = text.splitlines()
    commands: list[ShellCommand] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        stripped = line.strip()
        if not stripped:
            index += 1
            continue
        if stripped.startswith("#"):
            if stripped.startswith("# ->"):
                if not commands:
                    raise ValueError(f"line {index + 1}: an answer comment before any command")
                if commands[-1].expect is not None:
                    raise ValueError(f"line {index + 1}: a second answer for one command")
                parts = [stripped[len("# ->") :]]
                # An answer spans comment lines until its brackets close.
                while _balance(" ".join(parts)) > 0 and index + 1 < len(lines):
                    following = lines[index + 1].strip()
                    if not following.startswith("#") or following.startswith("# ->"):
                        break
                    index += 1
                    parts.append(following[1:])
                expect = parse_expectation(" ".join(parts))
                last = commands[-1]
                commands[-1] = ShellCommand(last.line, last.source, expect)
            index += 1
            continue
        start = index
        source = line
        while True:
            if source.endswith("\\") and index + 1 < len(lines):
                index += 1
                source = source[:-1] + " " + lines[index]
                continue
            body, closed = strip_comment(source)
            if not closed and index + 1 < len(lines):
                index += 1
                source = source + "\n" + lines[index]
                continue
            break
        if not closed:
            raise ValueError(f"line {start + 1}: a quote is never closed")
        shlex.split(body)  # raises on what sh could not split either
        commands.append(ShellCommand(start, body.strip()))
        index += 1
    return commands


def expand_variables(text: str, variables: Mapping[str, str]) -> str:
    """``$NAME`` and ``${NAME}`` outside single quotes replaced as sh does: unset is empty."""
    out: list[str] = []
    quote: str | None = None
    index = 0
    while index < len(text):
        char = text[index]
        if quote == "'":
            quote = None if char == "'" else quote
        elif char == "\\" and index + 1 < len(text):
            out.append(text[index : index + 2])
            index += 2
            continue
        elif char in "'\"" and quote is None:
            quote = char
        elif char == '"' and quote == '"':
            quote = None
        elif char == "$" and (found := VARIABLE.match(text, index)):
            name = found.group("braced") or found.group("plain")
            out.append(variables.get(name, ""))
            index = found.end()
            continue
        out.append(char)
        index += 1
    return "".join(out)


@dataclass(frozen=True)
class CurlRequest:
    """The request a ``curl`` command sends."""

    method: str
    url: str
    headers: list[tuple[str, str]]
    body: str | None


def parse_curl(words: list[str]) -> CurlRequest:
    """Reads the curl options the README uses; any other option is an error, never ignored."""
    if not words or words[0] != "curl":
        raise ValueError(f"not a curl command: {words[:1]}")
    method: str | None = None
    url: str | None = None
    headers: list[tuple[str, str]] = []
    body: str | None = None
    rest = iter(words[1:])
    for word in rest:
        if word in ("-s", "--silent", "-S", "--show-error", "-f", "--fail", "-sS"):
            continue
        if word in ("-X", "--request"):
            method = next(rest)
        elif word in ("-H", "--header"):
            name, sep, value = next(rest).partition(":")
            if not sep:
                raise ValueError(f"a header without a colon: {name!r}")
            headers.append((name.strip(), value.strip()))
        elif word in ("-d", "--data", "--data-raw", "--data-binary"):
            if body is not None:
                raise ValueError("more than one -d: curl would join them with '&'")
            body = next(rest)
            if word != "--data-raw" and body.startswith("@"):
                raise ValueError(f"-d {body[:20]}: a body read from a file")
        elif word.startswith("-"):
            raise ValueError(f"a curl option the examples' runner does not know: {word}")
        elif url is None:
            url = word
        else:
            raise ValueError(f"a second URL: {word}")
    if url is None:
        raise ValueError("curl without a URL")
    if not re.match(r"^[a-z]+://", url):
        url = "http://" + url  # as curl guesses
    if body is not None and not any(name.lower() == "content-type" for name, _ in headers):
        # What curl itself sends with -d: a JSON API then answers 415, as it should.
        headers.append(("Content-Type", "application/x-www-form-urlencoded"))
    return CurlRequest(method or ("POST" if body is not None else "GET"), url, headers, body)


SHELLS = {"sh", "bash", "shell", "console"}
KIND_OF_LANGUAGE = {
    "python": "python",
    "py": "python",
    "sql": "sql",
    "toml": "toml",
    "yaml": "yaml",
    "yml": "yaml",
    "ini": "ini",
}


def block_kind(block: Block) -> str | None:
    """How a block runs without a check of its own: ``curl`` (calls to send), ``settings``
    (``NAME=value`` lines), ``python``, ``sql``, ``toml``, ``yaml``, ``ini``; ``None`` when it
    cannot (other commands, other languages, no language)."""
    if block.lang in SHELLS:
        commands = shell_commands(block.text)
        if commands and all(c.is_simple and c.program == "curl" for c in commands):
            return "curl"
        if commands and all(c.program is None and c.is_simple for c in commands):
            return "settings"
        return None
    return KIND_OF_LANGUAGE.get(block.lang)


# -- answers as the README shows them -----------------------------------------------------------


def relaxed_json(text: str) -> Any:
    """JSON in which ``...`` or ``…`` outside strings means "and more".

    In an object it becomes the key :data:`ELLIPSIS` (more fields); in a list the item
    :data:`ELLIPSIS` (more items). Strings are left as they are.
    """
    out: list[str] = []
    stack: list[str] = []
    index = 0
    in_string = escaped = False
    while index < len(text):
        char = text[index]
        if in_string:
            out.append(char)
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            index += 1
            continue
        if char == '"':
            in_string = True
        elif char in "{[":
            stack.append(char)
        elif char in "}]" and stack:
            stack.pop()
        is_ellipsis = text.startswith("...", index) or char == ELLIPSIS
        if is_ellipsis:
            width = 3 if text.startswith("...", index) else 1
            if not stack:
                raise ValueError(f"'...' outside an object or a list in {text!r}")
            out.append(f'"{ELLIPSIS}": null' if stack[-1] == "{" else f'"{ELLIPSIS}"')
            index += width
            continue
        out.append(char)
        index += 1
    return json.loads("".join(out))


TIME_KEYS = re.compile(r"(^|_)(at|time)$")
JOB_ID_KEYS = {"job_id", "last_job_id", "callback_id"}
JOB_ID_LIST_KEYS = {"depends_on", "failed_ids", "ids"}
NAMESPACE_OF_ID_KEY = {"workflow_id": "workflow"}


class IdMap:
    """The README's ids and the service's, per kind of id (job, workflow, limit ...).

    The README numbers jobs as a fresh service would; the service the tests run may number them
    otherwise. The first time the README shows an id in an answer, its real value is learnt;
    after that, the README's id must be that same object, and requests naming it are sent with
    the real one.
    """

    def __init__(self) -> None:
        self._real: dict[tuple[str, int], int] = {}
        self._readme: dict[tuple[str, int], int] = {}

    def real(self, kind: str, readme_id: int) -> int | None:
        """The service's id for the README's ``readme_id``; ``None`` when not known yet."""
        return self._real.get((kind, readme_id))

    def learn(self, kind: str, readme_id: int, real_id: int) -> str | None:
        """Records or checks that ``readme_id`` is ``real_id``; answers a mismatch, if any."""
        known = self._real.get((kind, readme_id))
        if known is not None:
            if known != real_id:
                return (
                    f"the README's {kind} {readme_id} is {kind} {known} of this run, "
                    f"but the service answered {real_id}"
                )
            return None
        other = self._readme.get((kind, real_id))
        if other is not None:
            return (
                f"the README shows {kind} {readme_id} where the service answered {kind} "
                f"{real_id}, which the README called {other} before"
            )
        self._real[(kind, readme_id)] = real_id
        self._readme[(kind, real_id)] = readme_id
        return None


def _is_wildcard(value: Any) -> bool:
    return isinstance(value, str) and (ELLIPSIS in value or "..." in value)


def mismatches(
    expected: Any, actual: Any, *, ids: IdMap, top_kind: str = "job", where: str = "$"
) -> list[str]:
    """How ``actual`` differs from the README's ``expected`` answer (an empty list: it matches).

    Objects match when every field shown is there with a matching value (fields not shown are
    not looked at); lists match item by item, and ``...`` as their last item allows more.
    Strings containing ``...`` match any string; times (``*_at``) match any string (or null
    where the README shows null); ids are mapped through ``ids``.
    """
    found: list[str] = []
    _compare(expected, actual, ids, top_kind, where, None, found, depth=0)
    return found


def _compare(
    expected: Any,
    actual: Any,
    ids: IdMap,
    top_kind: str,
    where: str,
    key: str | None,
    found: list[str],
    depth: int,
) -> None:
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            found.append(f"{where}: expected an object, got {json.dumps(actual)[:200]}")
            return
        for name, value in expected.items():
            if name == ELLIPSIS:
                continue
            if name not in actual:
                found.append(f"{where}.{name}: missing (fields: {', '.join(actual)})")
                continue
            _compare(value, actual[name], ids, top_kind, f"{where}.{name}", name, found, depth + 1)
        return
    if isinstance(expected, list):
        if not isinstance(actual, list):
            found.append(f"{where}: expected a list, got {json.dumps(actual)[:200]}")
            return
        more = bool(expected) and expected[-1] == ELLIPSIS
        items = expected[:-1] if more else expected
        if len(actual) < len(items) or (not more and len(actual) != len(items)):
            shown = f"at least {len(items)}" if more else str(len(items))
            found.append(f"{where}: {shown} items expected, got {len(actual)}")
            return
        for index, item in enumerate(items):
            if key in JOB_ID_LIST_KEYS and isinstance(item, int):
                _compare_id("job", item, actual[index], ids, f"{where}[{index}]", found)
            else:
                _compare(
                    item, actual[index], ids, top_kind, f"{where}[{index}]", None, found, depth + 1
                )
        return
    if key is not None and isinstance(expected, int) and not isinstance(expected, bool):
        kind = _id_kind(key, top_kind, depth)
        if kind is not None:
            _compare_id(kind, expected, actual, ids, where, found)
            return
    if key is not None and TIME_KEYS.search(key):
        if expected is None:
            if actual is not None:
                found.append(f"{where}: expected null, got {actual!r}")
        elif not isinstance(actual, str):
            found.append(f"{where}: expected a time, got {actual!r}")
        return
    if _is_wildcard(expected):
        if not isinstance(actual, str):
            found.append(f"{where}: expected a string, got {actual!r}")
        return
    if isinstance(expected, bool) != isinstance(actual, bool) or expected != actual:
        found.append(
            f"{where}: the README shows {json.dumps(expected)}, the service answered "
            f"{json.dumps(actual)[:200]}"
        )


def _id_kind(key: str, top_kind: str, depth: int) -> str | None:
    if key == "id":
        return top_kind if depth == 1 else "job"
    if key in JOB_ID_KEYS:
        return "job"
    return NAMESPACE_OF_ID_KEY.get(key)


def _compare_id(
    kind: str, expected: int, actual: Any, ids: IdMap, where: str, found: list[str]
) -> None:
    if not isinstance(actual, int) or isinstance(actual, bool):
        found.append(f"{where}: expected an id, got {actual!r}")
        return
    problem = ids.learn(kind, expected, actual)
    if problem is not None:
        found.append(f"{where}: {problem}")


def walk_items(value: Any) -> Iterator[dict[str, Any]]:
    """Every object inside ``value``, outermost first."""
    if isinstance(value, dict):
        yield value
        for item in value.values():
            yield from walk_items(item)
    elif isinstance(value, list):
        for item in value:
            yield from walk_items(item)


def request_job_ids(value: Any) -> list[int]:
    """The job ids a request body names as parents (``depends_on``), in order."""
    found: list[int] = []
    for item in walk_items(value):
        for readme_id in item.get("depends_on") or []:
            if isinstance(readme_id, int) and not isinstance(readme_id, bool):
                found.append(readme_id)
    return found


def map_request(
    value: Any, ids: IdMap, fill: Callable[[str, dict[str, Any]], Any]
) -> tuple[Any, list[str]]:
    """``value`` with the README's job ids replaced by the service's and ``"<...>"`` filled.

    ``fill(name, item)`` answers the value of the placeholder in field ``name`` of ``item``
    (ids in ``item`` already mapped). Answers the new value and the problems: ids the README
    never showed.
    """
    problems: list[str] = []

    def job(readme_id: Any) -> Any:
        if not isinstance(readme_id, int) or isinstance(readme_id, bool):
            return readme_id
        real = ids.real("job", readme_id)
        if real is None:
            problems.append(f"job {readme_id} was never shown by an earlier example")
            return readme_id
        return real

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(item) for item in node]
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        for name, item in node.items():
            if name in JOB_ID_KEYS:
                out[name] = job(item)
            elif name in JOB_ID_LIST_KEYS and isinstance(item, list):
                out[name] = [job(i) for i in item]
            else:
                out[name] = walk(item)
        for name, item in list(out.items()):
            if isinstance(item, str) and PLACEHOLDER.match(item):
                out[name] = fill(name, out)
        return out

    return walk(value), problems
