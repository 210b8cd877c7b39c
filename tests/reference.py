"""The reference pages' generated parts, from the code: the CLI (from its argparse parser) and
every API operation (from openapi.json, itself generated from the app and checked against it).

    python -m tests.reference cli          # the table docs/reference/cli.md must hold
    python -m tests.reference operations   # the table docs/reference/api.md must hold

tests/unit/test_reference_docs.py fails while a page does not hold its table exactly, so a new
command, option or route cannot go undocumented; settings have their own (app.settings
``settings_table``, docs/reference/configuration.md), metrics theirs (the same test module).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from app.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("get", "put", "post", "patch", "delete")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _commands(
    parser: argparse.ArgumentParser, prefix: str
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:  # argparse keeps its subcommands here only
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                command = f"{prefix} {name}"
                yield command, helps.get(name, ""), sub
                yield from _commands(sub, command)


def _usage(parser: argparse.ArgumentParser) -> str:
    parts = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.help == argparse.SUPPRESS:
            continue  # not for users (the supervisor's own flag)
        if action.option_strings:
            flag = max(action.option_strings, key=len)
            takes = action.nargs != 0
            shown = f"{flag} {action.metavar or action.dest.upper()}" if takes else flag
            choices = f" ({', '.join(map(str, action.choices))})" if action.choices else ""
            parts.append(f"`{shown}`{choices}: {_cell(action.help or '')}".rstrip(": "))
        else:
            parts.append(
                f"`{action.metavar or action.dest}`: {_cell(action.help or '')}".rstrip(": ")
            )
    return "<br>".join(parts)


def cli_table() -> str:
    """Every command and subcommand of ``jobq``, what it does, and its arguments."""
    lines = ["| command | what it does | arguments |", "|---|---|---|"]
    for command, help_text, parser in _commands(build_parser(), "jobq"):
        lines.append(f"| `{command}` | {_cell(help_text)} | {_usage(parser)} |")
    return "\n".join(lines)


def operations_table() -> str:
    """Every operation of openapi.json: method and path, and the first paragraph of what it
    says it does (its description; its summary when it has none)."""
    document = json.loads((ROOT / "openapi.json").read_text(encoding="utf-8"))
    lines = ["| operation | what it does |", "|---|---|"]
    for path, item in sorted(document["paths"].items()):
        for method in METHODS:
            if method in item:
                operation = item[method]
                text = (operation.get("description") or operation.get("summary") or "").strip()
                lines.append(f"| `{method.upper()} {path}` | {_cell(text.split(chr(10) * 2)[0])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    tables = {"cli": cli_table, "operations": operations_table}
    if len(sys.argv) != 2 or sys.argv[1] not in tables:
        sys.exit(f"usage: python -m tests.reference {{{','.join(tables)}}}")
    print(tables[sys.argv[1]]())
