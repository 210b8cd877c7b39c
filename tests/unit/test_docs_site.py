"""The documentation site builds with ``mkdocs build --strict``: a link to a page or an anchor
that does not exist, a page left out of the navigation, or a broken reference fails here, not
on a reader's screen. It also keeps the site's pages and the navigation in step with docs/."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_SECONDS = 240  # a guard against a hung build (it takes a few seconds)


def nav_pages(entries: list[object]) -> list[str]:
    pages: list[str] = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            pages.extend(nav_pages(value))
        else:
            pages.append(str(value))
    return pages


def test_every_page_is_in_the_navigation_once() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    listed = nav_pages(config["nav"])
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(listed) == pages
    assert len(listed) == len(set(listed))


def test_the_site_builds_strict(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_SECONDS,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert (tmp_path / "index.html").is_file()
    assert (tmp_path / "architecture" / "database-logic" / "index.html").is_file()
