"""What a process tree costs, read from Linux ``/proc``: CPU seconds (utime + stime) and RSS.

Used by the load process (``python -m bench.load``) around its timed section, for the CPU the
`jobq serve` processes spent, and by ``python -m bench`` for each instance's RSS during the soak.
A tree is the process and its descendants, so a server that forks workers is counted whole.
Only the standard library: the load process imports this and must start and stay lean.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name, or None once the process is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name is in parentheses and may hold spaces or parentheses itself.
    return text[text.rindex(")") + 2 :].split()


def descendants(root: int) -> list[int]:
    """``root`` and every live process below it (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = stat_fields(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds one process has used so far (0.0 once it is gone)."""
    fields = stat_fields(pid)
    if fields is None:
        return 0.0
    # Fields 14 and 15 of stat(5) (utime, stime); the list starts at field 3 (state).
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def tree_cpu_seconds(roots: Iterable[int]) -> float:
    """CPU seconds used so far by each root and its live descendants, summed."""
    return sum(cpu_seconds(pid) for root in roots for pid in descendants(root))


def rss_bytes(pid: int) -> int:
    """Resident set size of one process (``VmRSS``), 0 once it is gone."""
    try:
        text = (PROC / str(pid) / "status").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return 0
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def tree_rss_bytes(root: int) -> int:
    """Resident set size of a process and its live descendants, summed."""
    return sum(rss_bytes(pid) for pid in descendants(root))
