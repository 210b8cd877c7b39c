"""A refused webhook address is not told to the producer (issue 40, item 9).

A callback whose host name resolves to an address the policy refuses (here a name of this
machine, which resolves to a loopback or private address) fails with a generic reason wherever a
producer or viewer key can read it: the deliveries, the job's history, the dashboard's job page.
The address itself goes to the server's log, with the job and the delivery.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket

from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.auth.keys import Role
from tests.api.dashboard import signed_in
from tests.api.helpers import running_app
from tests.api.test_webhooks import _loop
from tests.keys import as_key, make_key
from tests.logcapture import json_log_lines

# What callers are told instead of the address and its kind.
REFUSED = "the address this URL resolves to is not allowed"


def _internal_name() -> tuple[str, set[str]]:
    """A host name that resolves only to addresses the default policy refuses, and those."""
    for name in (socket.gethostname(), "127.1"):  # "127.1": inet_aton's short form of 127.0.0.1
        try:
            infos = socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)
        except socket.gaierror:
            continue
        found = {str(info[4][0]).split("%", 1)[0] for info in infos}
        if found and not any(ipaddress.ip_address(a).is_global for a in found):
            return name, found
    raise AssertionError("no name of this machine resolves to a non-public address")


async def test_a_refused_address_is_generic_to_callers_and_detailed_in_the_log(
    database_url: str, clean_db: AsyncEngine
) -> None:
    name, addresses = _internal_name()
    async with running_app(database_url, webhook_secret="whsec_privacy_test") as client:
        app = client.app  # type: ignore[attr-defined]
        producer = await make_key(clean_db, "producer", Role.PRODUCER)
        viewer = await make_key(clean_db, "viewer", Role.VIEWER)
        worker = await make_key(clean_db, "worker", Role.WORKER)
        await app_state(app).running().keys.refresh()
        async with as_key(client, producer) as p, as_key(client, worker) as w:
            r = await p.post("/v1/jobs", json={"type": "t", "callback_url": f"http://{name}:9/"})
            assert r.status_code == 201, r.text  # a name: checked when the delivery resolves it
            job_id = r.json()["id"]
            [held] = (
                await w.post("/v1/claim", json={"worker_id": "w", "queues": ["default"]})
            ).json()["jobs"]
            lease = {"job_id": job_id, "lease_id": held["lease_id"]}
            assert (
                await w.post("/v1/complete", json={"worker_id": "w", "leases": [lease]})
            ).is_success
        with json_log_lines(logging.INFO) as log:
            counts = await _loop(client).run_once()
        assert counts.failed == 1

        readable: list[str] = []
        for secret in (producer, viewer):
            async with as_key(client, secret) as reader:
                deliveries = (await reader.get(f"/v1/jobs/{job_id}/webhooks")).json()
                [delivery] = deliveries["deliveries"]
                assert delivery["state"] == "failed"
                assert REFUSED in delivery["last_error"]
                events = (await reader.get(f"/v1/jobs/{job_id}/events")).json()["events"]
                [hook] = [e for e in events if e["kind"] == "webhook"]
                assert REFUSED in hook["data"]["error"]
                readable += [json.dumps(deliveries), json.dumps(events)]
                readable.append((await reader.get(f"/v1/jobs/{job_id}")).text)
        async with signed_in(app, viewer) as browser:
            page = await browser.get(f"/dashboard/jobs/{job_id}")
            assert page.status_code == 200 and REFUSED in page.text
            readable.append(page.text)
        for text in readable:
            for address in addresses:
                assert address not in text, (address, text[:2000])
            assert "loopback" not in text and "private" not in text

        [line] = [json.loads(x) for x in log.getvalue().splitlines() if '"webhook.refused"' in x]
        assert line["job_id"] == job_id and line["delivery_id"] == delivery["id"]
        assert any(address in line["message"] for address in addresses), line
