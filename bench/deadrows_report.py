"""The text ``python -m bench.deadrows`` prints: one block per run, then jobq against the lean table."""

from __future__ import annotations

from typing import Any

TOP_STATEMENTS = 12


def _number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table_lines(rows: list[dict[str, Any]], total: dict[str, Any]) -> list[str]:
    """Per table: inserts, updates, HOT updates (and share), deletes, dead tuples at the end."""
    lines = [
        f"  {'table':<28}{'ins/job':>9}{'upd/job':>9}{'hot/job':>9}{'hot %':>7}"
        f"{'del/job':>9}{'made dead':>10}{'dead end':>10}{'heap B/job':>12}"
    ]
    for row in [*rows, total]:
        lines.append(
            f"  {row['table']:<28}{_number(row['ins_per_job']):>9}{_number(row['upd_per_job']):>9}"
            f"{_number(row['hot_per_job']):>9}{_number(row['hot_pct'], 0):>7}"
            f"{_number(row['del_per_job']):>9}{_number(row['made_dead_per_job']):>10}"
            f"{_number(row['dead_per_job']):>10}"
            f"{_number(row.get('heap_growth_per_job'), 0):>12}"
        )
    return lines


def kind_lines(kinds: list[dict[str, Any]]) -> list[str]:
    """Per statement kind: calls, rows, WAL bytes and blocks dirtied per job."""
    lines = [
        f"  {'statement kind':<34}{'calls/job':>10}{'rows/job':>10}{'WAL B/job':>11}{'dirtied/job':>12}"
    ]
    for row in kinds:
        name = row["kind"] if row["toplevel"] else f"  (nested) {row['kind']}"
        lines.append(
            f"  {name:<34}{_number(row['calls_per_job']):>10}{_number(row['rows_per_job']):>10}"
            f"{_number(row['wal_per_job'], 0):>11}{_number(row['dirtied_per_job']):>12}"
        )
    return lines


def statement_lines(statements: list[dict[str, Any]]) -> list[str]:
    """The statements that wrote the most WAL, named."""
    lines = [
        f"  {'statement (top by WAL)':<62}{'calls/job':>10}{'WAL B/job':>11}{'dirtied/job':>12}"
    ]
    shown = [s for s in statements if s["kind"] != "bench"][:TOP_STATEMENTS]
    for row in shown:
        name = row["label"] if row["toplevel"] else f"(nested) {row['label']}"
        lines.append(
            f"  {name[:61]:<62}{_number(row['calls_per_job']):>10}"
            f"{_number(row['wal_per_job'], 0):>11}{_number(row['dirtied_per_job']):>12}"
        )
    return lines


def index_lines(indexes: list[dict[str, Any]]) -> list[str]:
    """Each index's size at the end of the run and its growth per job."""
    lines = [f"  {'index (grown during the run)':<44}{'bytes':>12}{'grown B/job':>13}"]
    grown = [row for row in indexes if row["growth_per_job"] > 0]
    for row in grown:
        lines.append(
            f"  {row['index'][:43]:<44}{row['bytes']:>12,}{_number(row['growth_per_job'], 1):>13}"
        )
    if unchanged := len(indexes) - len(grown):
        lines.append(f"  ({unchanged} other indexes did not grow)")
    return lines


def print_run(run: dict[str, Any]) -> None:
    """One run's block."""
    held = f", horizon held by xid {run['held_xid']}" if run["held_xid"] else ""
    rate = f", {run['rate']:g} jobs/s offered" if run["rate"] else ""
    print(
        f"\n== {run['system']} {run['workload']}: {run['jobs']} jobs, {run['workers']} workers"
        f"{rate}, {run['seconds']:.1f} s{held}"
    )
    print("\n".join(table_lines(run["tables"], run["total"])))
    wal = run["wal_per_job"]
    print("  WAL bytes/job: " + ", ".join(f"{phase} {value:.0f}" for phase, value in wal.items()))
    sampled = run["dead_sampled"]
    if sampled["samples"]:
        print(
            f"  dead tuples, all tables, sampled every second: median {sampled['median']:,.0f}, "
            f"max {sampled['max']:,} ({sampled['samples']} samples)"
        )
    if run["kinds"] is None:
        print(f"  per statement kind: skipped (pg_stat_statements: {run['pg_stat_statements']})")
    else:
        print("\n".join(kind_lines(run["kinds"])))
        print("\n".join(statement_lines(run["statements"])))
    if run["workload"] == "drain-held":
        print("\n".join(index_lines(run["indexes"])))
    if run["failures"]:
        print(f"  FAILED: {'; '.join(run['failures'][:5])}")


def print_summary(runs: list[dict[str, Any]]) -> None:
    """jobq beside the lean table, per workload: totals over every table, per job (made dead:
    updates plus deletes, each leaving one dead heap version; dead end: n_dead_tup at the end;
    index B: index growth; dead median: n_dead_tup over all tables, sampled every second)."""
    print("\n== jobq against the lean queue table, per job, all tables")
    print(
        f"  {'workload':<13}{'system':<7}{'ins':>7}{'upd':>7}{'hot':>7}{'del':>7}{'made dead':>10}"
        f"{'dead end':>9}{'WAL B':>8}{'index B':>9}{'dead median':>13}"
    )
    by_key = {(r["workload"], r["system"]): r for r in runs}
    for workload in dict.fromkeys(r["workload"] for r in runs):
        for system in ("jobq", "lean"):
            run = by_key.get((workload, system))
            if run is None:
                continue
            total = run["total"]
            index_growth = sum(i["growth_per_job"] for i in run["indexes"])
            median = run["dead_sampled"]["median"]
            print(
                f"  {workload:<13}{system:<7}{total['ins_per_job']:>7.2f}{total['upd_per_job']:>7.2f}"
                f"{total['hot_per_job']:>7.2f}{total['del_per_job']:>7.2f}"
                f"{total['made_dead_per_job']:>10.2f}{total['dead_per_job']:>9.2f}"
                f"{run['wal_per_job']['total']:>8.0f}{index_growth:>9.0f}"
                f"{'-' if median is None else f'{median:,.0f}':>13}"
            )
        jobq, lean = by_key.get((workload, "jobq")), by_key.get((workload, "lean"))
        if jobq and lean and lean["total"]["made_dead_per_job"] and lean["wal_per_job"]["total"]:
            made = jobq["total"]["made_dead_per_job"] / lean["total"]["made_dead_per_job"]
            wal_ratio = jobq["wal_per_job"]["total"] / lean["wal_per_job"]["total"]
            print(f"  {'':<13}jobq/lean: heap versions made dead x{made:.1f}, WAL x{wal_ratio:.1f}")
