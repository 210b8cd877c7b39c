"""Ops actions racing each other answer one consistent state each (audit bug 2).

``cancel`` and ``retry`` used to run their statement and re-read the row in a separate commit;
a transition in between gave a 500 (an ``assert`` fired) or a 409 naming a state that allowed
the action. 500 cancels racing 500 retries on one job gave 18 answers of 500.
"""

from __future__ import annotations

import asyncio
import re

import httpx

from tests.api.helpers import claim, enqueue, lease, lease_call

ROUNDS = 500
CANCELLABLE = {"scheduled", "pending", "running"}
RETRYABLE = {"succeeded", "dead", "cancelled"}


async def test_cancels_racing_retries_each_answer_a_consistent_state(
    client: httpx.AsyncClient,
) -> None:
    await enqueue(client)
    [c] = await claim(client)
    await lease_call(client, "complete", "w1", lease(c))
    job_id = c["id"]

    async def act(action: str) -> tuple[str, httpx.Response]:
        return action, await client.post(f"/v1/jobs/{job_id}/{action}")

    answers = await asyncio.gather(*(act(a) for _ in range(ROUNDS) for a in ("cancel", "retry")))
    codes = {r.status_code for _, r in answers}
    assert codes <= {200, 409}, [r.text for _, r in answers if r.status_code not in (200, 409)]
    for action, response in answers:
        if response.status_code == 200:
            expected = "cancelled" if action == "cancel" else "pending"
            assert response.json()["status"] == expected, (action, response.text)
            continue
        # A refusal names the state it saw, and that state really refuses the action.
        match = re.search(r"is (\w+);", response.json()["detail"])
        assert match is not None, response.text
        refused_in = match.group(1)
        allowed = CANCELLABLE | {"cancelled"} if action == "cancel" else RETRYABLE
        assert refused_in not in allowed, (action, response.text)
    assert any(r.status_code == 200 for a, r in answers if a == "retry")
    assert any(r.status_code == 200 for a, r in answers if a == "cancel")
