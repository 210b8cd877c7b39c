"""The layout in docs/architecture/overview.md matches the tree: every package and module of
app/ (and every SQL file of the store) is named in its package's entry, and every path the
layout names exists. A module added without a line there, or one renamed or removed while the
page still names it, fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture" / "overview.md"
ENTRY = re.compile(r"^( *)(\S+?/|\S+\.py|\S+\.sql)(?:,| |$)")


def layout_lines() -> list[str]:
    text = PAGE.read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    return block.splitlines()[1:]


def sections() -> dict[str, str]:
    """Text per entry of app/ (a package ``app/store/`` or a root module ``app/main.py``) and
    per top-level folder: each entry's lines, its continuation lines and its children's."""
    found: dict[str, str] = {}
    top = package = ""
    for line in layout_lines():
        indent = len(line) - len(line.lstrip(" "))
        match = ENTRY.match(line)
        if match and indent == 0:
            top, package = match.group(2), ""
            found[top] = line
            continue
        if match and indent == 2 and top == "app/":
            package = "app/" + match.group(2)
            found[package] = line
            found[top] += "\n" + line
            continue
        if package:
            found[package] += "\n" + line
        found[top] = found.get(top, "") + "\n" + line
    return found


def named(text: str, stem: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(stem)}(\.py|\.sql|/)?(?![\w])", text) is not None


def test_every_package_and_module_of_app_is_in_its_entry() -> None:
    by_entry = sections()
    missing: list[str] = []
    for path in sorted((ROOT / "app").iterdir()):
        if path.name.startswith(("_", ".")) or path.name == "py.typed":  # __init__.py too
            continue
        if path.is_dir():
            entry = by_entry.get(f"app/{path.name}/")
            if entry is None:
                missing.append(f"app/{path.name}/ (no entry)")
                continue
            for module in sorted(path.rglob("*.py")):
                if module.name != "__init__.py" and not named(entry, module.stem):
                    missing.append(str(module.relative_to(ROOT)))
            for sql in sorted(path.rglob("*.sql")):
                if not named(entry, sql.stem):
                    missing.append(str(sql.relative_to(ROOT)))
        elif path.suffix == ".py" and not named(by_entry["app/"], path.stem):
            missing.append(str(path.relative_to(ROOT)))
    assert missing == [], "add them to the layout in docs/architecture/overview.md"


def test_every_top_level_folder_is_in_the_layout() -> None:
    by_entry = sections()
    folders = [
        p.name + "/"
        for p in ROOT.iterdir()
        if p.is_dir()
        and not p.name.startswith(".")
        and p.name not in NOT_THE_PROJECTS
        and not p.name.endswith(".egg-info")
    ]
    assert sorted(f for f in folders if f not in by_entry) == []


# What a checkout grows that is not the project's (built site, caches, virtualenvs).
NOT_THE_PROJECTS = {"site", "build", "dist", "__pycache__", "node_modules"}


def test_every_file_the_layout_names_exists() -> None:
    gone: list[str] = []
    for top, text in sections().items():
        base = ROOT / top.rstrip("/") if top.endswith("/") else ROOT
        for token in re.findall(r"(?<![\w./-])([a-z_]+(?:/[a-z_]+)*\.(?:py|sql))\b", text):
            candidates = [base / token, *base.rglob(Path(token).name)] if base.is_dir() else []
            if not any(c.is_file() for c in candidates):
                gone.append(f"{top}: {token}")
    assert gone == [], "named in the layout, not in the tree"
