"""The load process: runs one workload against `jobq serve` (HTTP) or PostgreSQL (raw SQL), prints JSON.

    python -m bench.load <workload> '<json args>'

``python -m bench`` starts this as a subprocess for every run, so the load is generated neither
by the orchestrator nor by the server. Workloads: ``enqueue``, ``drain``, ``latency``,
``claim-latency``, ``lease-latency`` and ``soak`` over HTTP (``bench/workloads.py``; each
sends ``api_key`` as a bearer token when given); ``chain`` and ``fanin`` over HTTP
(``bench/composed.py``); ``raw-enqueue`` and ``raw-drain`` over asyncpg (``bench/baseline.py``,
on jobq's schema or on the lean queue table, whichever database ``dsn`` names); ``raw-chain``
and ``raw-fanin`` over asyncpg (``bench/composed_raw.py``); ``pgqueuer-enqueue`` and
``pgqueuer-drain`` through PGQueuer in this process (``bench/peers.py``), ``procrastinate-enqueue``
and ``procrastinate-drain`` through Procrastinate (``bench/procrastinate_peer.py``), both for
``python -m bench --peers``. The answer, one JSON object on
stdout, holds the workload's own figures plus, over its timed section, the wall seconds, this
process's CPU seconds and the CPU seconds of the server processes named in ``server_pids``
(Linux ``/proc``). It imports neither the service nor SQLAlchemy, so it starts fast and stays
lean.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from bench.common import Errors, Meter, Workload


def workloads() -> dict[str, Workload]:
    """Every workload by name (imported here so each process loads only what it runs)."""
    from bench import baseline, composed, composed_raw, workloads

    return {
        "enqueue": workloads.enqueue,
        "drain": workloads.drain,
        "latency": workloads.latency,
        "claim-latency": workloads.claim_latency,
        "lease-latency": workloads.lease_latency,
        "soak": workloads.soak,
        "chain": composed.chain,
        "fanin": composed.fanin,
        "raw-enqueue": baseline.enqueue,
        "raw-drain": baseline.drain,
        "raw-chain": composed_raw.chain,
        "raw-fanin": composed_raw.fanin,
        "pgqueuer-enqueue": pgqueuer_enqueue,
        "pgqueuer-drain": pgqueuer_drain,
        "procrastinate-enqueue": procrastinate_enqueue,
        "procrastinate-drain": procrastinate_drain,
    }


async def pgqueuer_enqueue(args: dict[str, Any], meter: Meter, errors: Errors) -> dict[str, Any]:
    """``bench.peers.enqueue``, imported only by the process that runs it (PGQueuer is optional)."""
    from bench import peers

    return await peers.enqueue(args, meter, errors)


async def pgqueuer_drain(args: dict[str, Any], meter: Meter, errors: Errors) -> dict[str, Any]:
    """``bench.peers.drain``, imported only by the process that runs it (PGQueuer is optional)."""
    from bench import peers

    return await peers.drain(args, meter, errors)


async def procrastinate_enqueue(
    args: dict[str, Any], meter: Meter, errors: Errors
) -> dict[str, Any]:
    """``bench.procrastinate_peer.enqueue``, imported only by the process that runs it."""
    from bench import procrastinate_peer

    return await procrastinate_peer.enqueue(args, meter, errors)


async def procrastinate_drain(args: dict[str, Any], meter: Meter, errors: Errors) -> dict[str, Any]:
    """``bench.procrastinate_peer.drain``, imported only by the process that runs it."""
    from bench import procrastinate_peer

    return await procrastinate_peer.drain(args, meter, errors)


async def run(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """Runs workload ``name`` with ``args``; answers its figures, the meter's and the errors."""
    meter, errors = Meter(args.get("server_pids", [])), Errors()
    figures = await workloads()[name](args, meter, errors)
    return {"workload": name, **figures, **meter.figures(), **errors.figures()}


def main(argv: Sequence[str]) -> int:
    """Command line: ``<workload> <json args>``; prints one JSON object."""
    if len(argv) != 2 or argv[0] not in workloads():
        print(f"usage: python -m bench.load {{{','.join(workloads())}}} '<json args>'")
        return 2
    result = asyncio.run(run(argv[0], json.loads(argv[1])))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
