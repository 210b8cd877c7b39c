"""The workflow page: its graph and table, the links between jobs and workflows, cancel and retry
of a whole workflow, scopes, unknown ids, and hostile step names."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.api.dashboard import DashboardKeys, api, csrf_of, job_status, signed_in
from tests.api.helpers import claim, lease, lease_call

ONLOAD = '"><svg onload=alert(1)>'
SCRIPT = "<script>alert('owned')</script>"


@pytest.fixture
async def producer(app: FastAPI, dashboard_keys: DashboardKeys) -> AsyncIterator[httpx.AsyncClient]:
    """The API as the admin key: enqueues, claims and finishes steps."""
    async with api(app, dashboard_keys.admin) as client:
        yield client


@pytest.fixture
async def admin(app: FastAPI, dashboard_keys: DashboardKeys) -> AsyncIterator[httpx.AsyncClient]:
    """A browser signed in with the admin key."""
    async with signed_in(app, dashboard_keys.admin) as client:
        yield client


async def make_workflow(
    client: httpx.AsyncClient, steps: list[dict[str, Any]], name: str = "nightly"
) -> dict[str, Any]:
    answer = await client.post("/v1/workflows", json={"name": name, "steps": steps})
    assert answer.status_code == 201, answer.text
    made: dict[str, Any] = answer.json()
    return made


def step_ids(workflow: dict[str, Any]) -> dict[str, int]:
    return {s["name"]: s["job"]["id"] for s in workflow["steps"]}


def diamond(queue: str = "etl") -> list[dict[str, Any]]:
    """extract -> (clean, enrich) -> load, and a step alone (in a queue of its own, so claims
    from ``queue`` take the graph's steps in order)."""
    return [
        {"name": "extract", "queue": queue, "type": "extract"},
        {"name": "clean", "after": ["extract"], "queue": queue, "type": "clean", "max_attempts": 1},
        {"name": "enrich", "after": ["extract"], "queue": queue, "type": "enrich"},
        {"name": "load", "after": ["clean", "enrich"], "queue": queue, "type": "load"},
        {"name": "notify", "queue": f"{queue}-side", "type": "notify"},
    ]


async def finish(client: httpx.AsyncClient, queue: str, job_type: str, *, fail: bool) -> None:
    """Claims the queue's next job (it must be of ``job_type``) and completes or fails it."""
    [held] = await claim(client, worker="w1", queues=[queue])
    assert held["type"] == job_type, held
    if fail:
        await lease_call(client, "fail", "w1", lease(held, error="boom", retry_after_seconds=0))
    else:
        await lease_call(client, "complete", "w1", lease(held, result={"ok": True}))


def svg(html: str) -> str:
    return html.split('<svg id="workflow-graph"', 1)[1].split("</svg>", 1)[0]


def row(html: str, job_id: int) -> str:
    return html.split(f'<tr id="step-{job_id}"', 1)[1].split("</tr>", 1)[0]


async def test_the_page_draws_each_step_and_dependency_with_states_and_links(
    admin: httpx.AsyncClient, producer: httpx.AsyncClient
) -> None:
    made = await make_workflow(producer, diamond())
    ids = step_ids(made)
    await finish(producer, "etl", "extract", fail=False)

    page = await admin.get(f"/dashboard/workflows/{made['id']}")
    assert page.status_code == 200, page.text
    html = page.text
    assert '<span class="state state-running" id="workflow-state">running</span>' in html
    assert "nightly" in html and "created" in html and "admin" in html  # created by the key
    counts = html.split('id="workflow-counts" class="counts">', 1)[1].split("</dl>", 1)[0]
    assert re.sub(r"<[^>]+>|\s", "", counts) == "pending3succeeded1waiting1"
    graph = svg(html)
    assert graph.count('<g class="wf-node') == 5
    assert graph.count('class="wf-edge"') == 4  # extract->clean, extract->enrich, twice to load
    assert graph.count('marker-end="url(#wf-arrow)"') == 4
    expected = {
        "extract": "succeeded",
        "clean": "pending",
        "enrich": "pending",
        "load": "waiting",
        "notify": "pending",
    }
    for name, state in expected.items():
        node = graph.split(f'data-step-job="{ids[name]}"', 1)[1].split("</a>", 1)[0]
        assert f'class="wf-node wf-{state}" data-state="{state}"' in node
        assert f">{name}</text>" in node
        assert f'<a class="wf-link" href="/dashboard/jobs/{ids[name]}"' in graph
        cells = row(html, ids[name])
        assert f'<a class="job-link" href="/dashboard/jobs/{ids[name]}">#{ids[name]}</a>' in cells
        assert f'<span class="state state-{state}">{state}</span>' in cells
    assert "clean, enrich" in row(html, ids["load"])
    # Layers left to right: each step's box starts right of its parents' boxes.
    x = {
        name: float(re.findall(r'<rect x="([\d.]+)"', graph.split(f'data-step-job="{i}"')[1])[0])
        for name, i in ids.items()
    }
    assert x["extract"] == x["notify"] < x["clean"] == x["enrich"] < x["load"]
    # The refreshable part, for htmx.
    fragment = await admin.get(
        f"/dashboard/fragments/workflows/{made['id']}", headers={"HX-Request": "true"}
    )
    assert fragment.text.lstrip().startswith('<section id="workflow-live"')
    assert "<html" not in fragment.text


async def test_job_pages_link_their_workflow_and_parents_and_say_what_they_wait_for(
    admin: httpx.AsyncClient, producer: httpx.AsyncClient
) -> None:
    made = await make_workflow(producer, diamond())
    ids = step_ids(made)
    await finish(producer, "etl", "extract", fail=False)
    await finish(producer, "etl", "clean", fail=False)

    load = (await admin.get(f"/dashboard/jobs/{ids['load']}")).text
    assert f'<a id="job-workflow" href="/dashboard/workflows/{made["id"]}">' in load
    assert '<strong id="job-step">load</strong>' in load
    parents = load.split('id="job-parents"', 1)[1].split("</dd>", 1)[0]
    for name, state in (("clean", "succeeded"), ("enrich", "pending")):
        assert f'href="/dashboard/jobs/{ids[name]}" data-job-id="{ids[name]}"' in parents
        assert f'<span class="state state-{state}">{state}</span>' in parents
    # What it waits for: the blockers GET /v1/jobs/{id}/blockers names.
    blockers = load.split('<ul class="blockers" id="job-blockers">', 1)[1].split("</ul>", 1)[0]
    assert blockers == (
        f'<li data-kind="parents">waits for 1 unfinished job(s): {ids["enrich"]}</li>'
    )
    # The history tells when a step became due, and after which job.
    clean = (await admin.get(f"/dashboard/jobs/{ids['clean']}")).text
    assert f"job {ids['extract']} ended: moved to pending" in clean
    # The cancel button covers a waiting job.
    assert 'id="job-cancel"' in load
    # A root step links its workflow, and has no parents to wait for.
    notify = (await admin.get(f"/dashboard/jobs/{ids['notify']}")).text
    assert 'id="job-workflow"' in notify and 'id="job-parents"' not in notify
    assert 'data-kind="parents"' not in notify


async def test_a_job_waiting_on_plain_depends_on_and_on_an_ordering_key(
    admin: httpx.AsyncClient, producer: httpx.AsyncClient
) -> None:
    parent = (await producer.post("/v1/jobs", json={"queue": "q", "type": "p"})).json()
    child = await producer.post(
        "/v1/jobs",
        json={
            "queue": "q",
            "type": "c",
            "depends_on": [parent["id"]],
            "on_parent_failure": "run",
        },
    )
    assert child.status_code == 201, child.text
    child_id = child.json()["id"]
    page = (await admin.get(f"/dashboard/jobs/{child_id}")).text
    assert 'id="job-workflow"' not in page
    assert "(runs even if one fails)" in page
    assert f'<li data-kind="parents">waits for 1 unfinished job(s): {parent["id"]}</li>' in page
    first = await producer.post("/v1/jobs", json={"queue": "o", "type": "t", "ordering_key": "k1"})
    second = await producer.post("/v1/jobs", json={"queue": "o", "type": "t", "ordering_key": "k1"})
    assert first.status_code == second.status_code == 201
    assert second.json()["status"] == "waiting"
    page = (await admin.get(f"/dashboard/jobs/{second.json()['id']}")).text
    assert '<code id="job-ordering-key">k1</code>' in page
    ahead = first.json()["id"]
    assert f'<li data-kind="ordering_key">job {ahead} of ordering key k1 runs first</li>' in page

    # The jobs list filters by waiting; the overview and the list count waiting jobs.
    listed = (await admin.get("/dashboard/jobs?state=waiting")).text
    found = [int(i) for i in re.findall(r'<tr data-job-id="(\d+)"', listed)]
    assert found == [second.json()["id"], child_id]
    assert '<option value="waiting" selected>' in listed
    assert '<span data-total="waiting">2</span>' in listed
    overview = (await admin.get("/dashboard")).text
    cell = overview.split('<tr data-queue="o"', 1)[1].split("</tr>", 1)[0]
    assert re.search(r'data-col="waiting"><a class="count" href="[^"]+">1</a>', cell), cell


async def test_cancel_and_retry_are_confirmed_then_move_the_steps(
    app: FastAPI, admin: httpx.AsyncClient, producer: httpx.AsyncClient
) -> None:
    made = await make_workflow(producer, diamond())
    ids = step_ids(made)
    await finish(producer, "etl", "extract", fail=False)
    await finish(producer, "etl", "clean", fail=True)  # one attempt: dead; load is cancelled

    page = (await admin.get(f"/dashboard/workflows/{made['id']}")).text
    assert 'id="workflow-cancel"' in page and 'id="workflow-retry"' in page
    load = (await admin.get(f"/dashboard/jobs/{ids['load']}")).text
    assert f"cancelled: parent job {ids['clean']} ended dead" in load
    confirm = await admin.get(f"/dashboard/workflows/{made['id']}/cancel")
    assert confirm.status_code == 200
    assert "<strong>2</strong> steps" in confirm.text  # enrich and notify are open
    moving = confirm.text.split('id="workflow-moving"', 1)[1].split("</ul>", 1)[0]
    assert set(map(int, re.findall(r'data-job-id="(\d+)"', moving))) == {
        ids["enrich"],
        ids["notify"],
    }
    assert str(await job_status(app, ids["enrich"])) == "pending"  # nothing changed yet
    form = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', confirm.text))
    assert set(form) == {"csrf", "confirmed"}
    done = await admin.post(f"/dashboard/workflows/{made['id']}/cancel", data=form)
    assert done.status_code == 303
    assert done.headers["location"] == f"/dashboard/workflows/{made['id']}"
    after = (await admin.get(done.headers["location"])).text
    assert '<div id="flash" class="flash flash-ok" role="status">Cancelled 2 steps</div>' in after
    assert '<span class="state state-failed" id="workflow-state">failed</span>' in after
    assert 'id="workflow-cancel"' not in after
    for name in ("enrich", "notify", "load"):
        assert str(await job_status(app, ids[name])) == "cancelled"

    confirm = await admin.get(f"/dashboard/workflows/{made['id']}/retry")
    assert "<strong>4</strong> steps" in confirm.text  # clean (dead) and three cancelled
    form = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', confirm.text))
    done = await admin.post(f"/dashboard/workflows/{made['id']}/retry", data=form)
    assert done.status_code == 303
    after = (await admin.get(done.headers["location"])).text
    assert "Retried 4 steps</div>" in after
    assert str(await job_status(app, ids["clean"])) == "pending"
    assert str(await job_status(app, ids["load"])) == "waiting"
    assert '<span class="state state-running" id="workflow-state">running</span>' in after

    # Without the form's token nothing happens; an unknown action is a 404.
    refused = await admin.post(f"/dashboard/workflows/{made['id']}/cancel", data={})
    assert refused.status_code == 403
    assert str(await job_status(app, ids["clean"])) == "pending"
    assert (await admin.get(f"/dashboard/workflows/{made['id']}/explode")).status_code == 404


async def test_a_viewer_sees_the_workflow_but_may_not_act_on_it(
    app: FastAPI, dashboard_keys: DashboardKeys, producer: httpx.AsyncClient
) -> None:
    made = await make_workflow(producer, diamond())
    ids = step_ids(made)
    async with signed_in(app, dashboard_keys.viewer) as viewer:
        page = await viewer.get(f"/dashboard/workflows/{made['id']}")
        assert page.status_code == 200
        assert 'id="workflow-cancel"' not in page.text and 'id="workflow-retry"' not in page.text
        assert (await viewer.get(f"/dashboard/workflows/{made['id']}/cancel")).status_code == 403
        token = csrf_of(page.text)
        for action in ("cancel", "retry"):
            answer = await viewer.post(
                f"/dashboard/workflows/{made['id']}/{action}", data={"csrf": token}
            )
            assert answer.status_code == 403
            assert "may not act on jobs and queues" in answer.text
    assert str(await job_status(app, ids["extract"])) == "pending"


async def test_a_scoped_key_sees_a_workflow_only_when_it_covers_every_step(
    app: FastAPI, dashboard_keys: DashboardKeys, producer: httpx.AsyncClient
) -> None:
    mixed = await make_workflow(
        producer,
        [
            {"name": "bill", "queue": "billing.eu", "type": "invoice"},
            {"name": "mail", "after": ["bill"], "queue": "emails", "type": "send"},
        ],
    )
    billing = await make_workflow(producer, diamond("billing.eu"))
    async with signed_in(app, dashboard_keys.scoped_viewer) as viewer:
        for path in (
            f"/dashboard/workflows/{mixed['id']}",
            f"/dashboard/fragments/workflows/{mixed['id']}",
        ):
            answer = await viewer.get(path)
            assert answer.status_code == 403
            assert "is not scoped to queue &#39;emails&#39;" in answer.text
        assert (await viewer.get(f"/dashboard/workflows/{billing['id']}")).status_code == 200
        # A step of another queue is refused on its job page the same way.
        mail = step_ids(mixed)["mail"]
        assert (await viewer.get(f"/dashboard/jobs/{mail}")).status_code == 403
    async with signed_in(app, dashboard_keys.scoped_admin) as admin:
        token = csrf_of((await admin.get(f"/dashboard/workflows/{billing['id']}")).text)
        assert (await admin.get(f"/dashboard/workflows/{mixed['id']}/cancel")).status_code == 403
        refused = await admin.post(
            f"/dashboard/workflows/{mixed['id']}/cancel", data={"csrf": token}
        )
        assert refused.status_code == 403
        assert str(await job_status(app, step_ids(mixed)["bill"])) == "pending"


async def test_unknown_workflows_are_404_pages(admin: httpx.AsyncClient) -> None:
    for path in (
        "/dashboard/workflows/987654321",
        "/dashboard/workflows/0",
        "/dashboard/workflows/abc",
        "/dashboard/workflows/99999999999999999999999",
        "/dashboard/workflows/987654321/cancel",
        "/dashboard/fragments/workflows/987654321",
    ):
        answer = await admin.get(path)
        assert answer.status_code == 404, path
        assert "Not found" in answer.text or "not found" in answer.text, path
    token = csrf_of((await admin.get("/dashboard")).text)
    answer = await admin.post("/dashboard/workflows/987654321/retry", data={"csrf": token})
    assert answer.status_code == 404


async def test_hostile_names_are_escaped_everywhere(
    admin: httpx.AsyncClient, producer: httpx.AsyncClient
) -> None:
    made = await make_workflow(
        producer,
        [
            {"name": SCRIPT, "queue": "etl", "type": "t"},
            {"name": ONLOAD, "after": [SCRIPT], "queue": "etl", "type": "t"},
            {"name": "x</text><script>", "after": [ONLOAD], "queue": "etl", "type": "t"},
        ],
        name=f"flow {SCRIPT}{ONLOAD}",
    )
    ids = step_ids(made)
    pages = [
        f"/dashboard/workflows/{made['id']}",
        f"/dashboard/workflows/{made['id']}/cancel",
        f"/dashboard/jobs/{ids[ONLOAD]}",
        f"/dashboard/jobs/{ids['x</text><script>']}",
    ]
    for path in pages:
        html = (await admin.get(path)).text
        assert "<script>alert" not in html and "<svg onload" not in html, path
        assert "</text><script>" not in html, path
        assert "<script>" not in html.replace('<script src="', ""), path
    html = (await admin.get(pages[0])).text
    assert "&lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt;" in html
    assert "&#34;&gt;&lt;svg onload=alert(1)&gt;" in html
    graph = svg(html)
    assert graph.count('<g class="wf-node') == 3 and graph.count('class="wf-edge"') == 2


async def test_a_large_workflow_is_drawn_in_a_scrolling_box_and_past_the_bound_listed(
    app: FastAPI, admin: httpx.AsyncClient, producer: httpx.AsyncClient
) -> None:
    # 60 steps: ten chains of six, each step after the previous one of its chain.
    steps = [
        {
            "name": f"c{c}-s{s}",
            "after": [f"c{c}-s{s - 1}"] if s else [],
            "queue": "wide",
            "type": "t",
        }
        for c in range(10)
        for s in range(6)
    ]
    made = await make_workflow(producer, steps)
    html = (await admin.get(f"/dashboard/workflows/{made['id']}")).text
    assert '<div class="wf-graph"' in html
    graph = svg(html)
    assert graph.count('<g class="wf-node') == 60 and graph.count('class="wf-edge"') == 50
    assert html.count('<tr id="step-') == 60

    from app.dashboard.pages import workflow as page

    bound = page.GRAPH_MAX_STEPS
    try:
        page.GRAPH_MAX_STEPS = 59
        html = (await admin.get(f"/dashboard/workflows/{made['id']}")).text
    finally:
        page.GRAPH_MAX_STEPS = bound
    assert 'id="workflow-graph"' not in html
    assert "60 steps: the graph is drawn up to 59." in html
    assert html.count('<tr id="step-') == 60
