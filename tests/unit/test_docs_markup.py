"""The Markdown we publish carries no leftovers of editing: stray comment markers, open code
fences, merge markers or notes to the editor rendered as text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted({ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("examples/**/*.md")})

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
MERGE_MARKER = re.compile(r"^(<{7}|={7}|>{7})(\s|$)")
# A note to whoever edits the page, such as `(3) In "## Layout", add these lines`.
EDITOR_NOTE = re.compile(
    r"^\s*\(\d+\)\s+(In|Add|Insert|Replace|Move|Remove|Put)\b|\b(TODO|FIXME|XXX)\b"
)
HEADING = re.compile(r"^\s{0,3}#{1,6}\s")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside code fences, numbered from 1; an unclosed fence fails the test."""
    lines: list[tuple[int, str]] = []
    fence: str | None = None
    opened_at = 0
    for number, line in enumerate(text.splitlines(), start=1):
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence, opened_at = match.group(1), number
                continue
            lines.append((number, line))
        elif (
            match
            and match.group(1)[0] == fence[0]
            and len(match.group(1)) >= len(fence)
            and not line.strip()[len(match.group(1)) :].strip()
        ):
            fence = None
    assert fence is None, f"the code fence opened on line {opened_at} is never closed"
    return lines


def markup_faults(text: str) -> list[str]:
    """What in ``text`` would render as junk, one line each."""
    faults: list[str] = []
    comment_open_at: int | None = None
    for number, line in prose_lines(text):
        rest = re.sub(r"`[^`]*`", "", line)  # inline code may show markers
        for marker in re.findall(r"<!--|-->", rest):
            if marker == "<!--":
                if comment_open_at is not None:
                    faults.append(
                        f"line {number}: <!-- inside the comment opened on line {comment_open_at}"
                    )
                comment_open_at = number
            elif comment_open_at is None:
                faults.append(f"line {number}: --> closes no comment")
            else:
                comment_open_at = None
        if comment_open_at is not None:
            continue  # inside a comment anything goes: it is not rendered
        if MERGE_MARKER.match(line):
            faults.append(f"line {number}: merge marker {line[:7]!r}")
        if EDITOR_NOTE.search(rest):
            faults.append(f"line {number}: note to the editor: {line.strip()[:80]!r}")
        if HEADING.match(line) and (line.count('"') % 2 or line.count("`") % 2):
            faults.append(f"line {number}: heading with an unbalanced quote: {line.strip()!r}")
    if comment_open_at is not None:
        faults.append(f"line {comment_open_at}: <!-- never closed")
    return faults


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_published_markdown_has_no_editing_leftovers(document: Path) -> None:
    """Each page renders without stray markup."""
    assert markup_faults(document.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ('## Deploying" before "## Layout".\n', "unbalanced quote"),
        ("Text\n-->\n", "closes no comment"),
        ("<!-- a note\n\nText\n", "never closed"),
        ("```\ncode\n", "never closed"),
        ('  (3) In "## Layout", add these lines\n', "note to the editor"),
        ("<<<<<<< HEAD\n", "merge marker"),
    ],
)
def test_each_kind_of_leftover_is_caught(text: str, fault: str) -> None:
    """The checks above would see the leftovers they are written for."""
    try:
        faults = markup_faults(text)
    except AssertionError as exc:
        faults = [str(exc)]
    assert any(fault in f for f in faults), faults


def test_markers_in_code_are_not_leftovers() -> None:
    """Comment markers shown as code, in a fence or inline, are content."""
    assert markup_faults("```html\n<!-- x\n```\nUse `-->` to close.\n<!-- hidden -->\n") == []
