/** The Worker's shared completes against a real server: one request carries every job that
 * returned meanwhile, each item's `ok` is its own, a stop during one hands back what its claim
 * took exactly once, and no more handlers than `concurrency` ever run. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { Worker, type WorkerOptions } from "../src/index.js";
import {
  deferred,
  directClient,
  DroppingProxy,
  eventually,
  MemoryLogger,
  recordingFetch,
  running,
  serverUrl,
  uniqueQueue,
  type Recorded,
} from "./support.js";

const client = directClient();

function worker(queue: string, options: WorkerOptions = {}): Worker {
  return new Worker({
    baseUrl: serverUrl(),
    queues: [queue],
    leaseSeconds: 30,
    waitSeconds: 1,
    graceSeconds: 5,
    handleSignals: false,
    logger: new MemoryLogger(),
    ...options,
  });
}

async function allDone(queue: string, count: number): Promise<void> {
  await eventually(`${count} jobs of ${queue} to succeed`, async () => {
    const page = await client.listJobs({ queue, status: "succeeded", limit: 200 });
    return page.jobs.length === count || undefined;
  });
}

/** The job ids a request's lease items name. */
function ids(request: Recorded): number[] {
  return (request.body?.leases ?? []).map((lease) => lease.job_id);
}

describe("shared completes", () => {
  test("jobs that return together are completed in fewer requests, each exactly once", async (t) => {
    const queue = uniqueQueue("shared");
    const proxy = await DroppingProxy.start(serverUrl());
    t.after(() => proxy.close());
    const jobs = 60;
    const concurrency = 8;
    const runs = new Map<number, number>();
    let active = 0;
    let most = 0;
    const w = worker(queue, { baseUrl: proxy.url, concurrency }).handle("work", async (ctx) => {
      runs.set(ctx.id, (runs.get(ctx.id) ?? 0) + 1);
      active += 1;
      most = Math.max(most, active);
      try {
        // Some return in the same turn, some a little later: batches of every size.
        if (ctx.id % 3 === 0) await new Promise((resolve) => setTimeout(resolve, ctx.id % 5));
        return { id: ctx.id };
      } finally {
        active -= 1;
      }
    });
    const batch = await client.enqueueBatchIds(
      Array.from({ length: jobs }, () => ({ queue, type: "work" })),
    );
    running(w, t);
    await allDone(queue, jobs);
    assert.ok(most <= concurrency, `${most} handlers ran at once`);
    assert.deepEqual([...runs.keys()].sort(), [...batch.ids].sort());
    assert.ok([...runs.values()].every((n) => n === 1), "every job ran once");
    const completes = proxy.count("POST /v1/complete");
    assert.ok(completes < jobs, `${completes} complete requests for ${jobs} jobs`);
    // Kept alive and reused: no connection per request (the pool: min(concurrency, 16) + 4).
    assert.ok(proxy.accepted <= concurrency + 4, `${proxy.accepted} connections`);
    assert.ok(proxy.requests.length > proxy.accepted, `${proxy.requests.length} requests`);
    for (const id of batch.ids.slice(0, 10)) {
      const job = await client.getJob(id);
      assert.equal(job.attempts, 1);
      assert.deepEqual(job.result, { id });
      const events = await client.jobEvents(id);
      assert.equal(events.events.filter((e) => e.kind === "completed").length, 1);
    }
  });

  test("a complete's claim asks for every free slot, and a batch holds many jobs", async (t) => {
    const queue = uniqueQueue("shared-claim");
    const requests: Recorded[] = [];
    const concurrency = 16;
    const w = worker(queue, { concurrency, fetch: recordingFetch(requests) }).handle(
      "noop",
      async () => null,
    );
    await client.enqueueBatchIds(Array.from({ length: 64 }, () => ({ queue, type: "noop" })));
    running(w, t);
    await allDone(queue, 64);
    const completes = requests.filter((r) => r.line === "POST /v1/complete");
    const sizes = completes.map((r) => ids(r).length);
    assert.equal(
      sizes.reduce((a, b) => a + b, 0),
      64,
      `items ${sizes.join(",")}`,
    );
    assert.equal(new Set(completes.flatMap(ids)).size, 64, "no job completed twice");
    assert.ok(Math.max(...sizes) > 1, `items ${sizes.join(",")}`);
    // The first batch frees the slots the first claim filled: its claim asks for all of them.
    const asked = completes.map((r) => r.body?.claim_next?.max_jobs ?? 0);
    assert.ok(Math.max(...asked) > 1, `claim_next ${asked.join(",")}`);
    assert.ok(asked.every((n) => n <= concurrency), `claim_next ${asked.join(",")}`);
  });

  test("a job lost while its handler ran is never completed; its batch mate is", async (t) => {
    const queue = uniqueQueue("shared-lost");
    const requests: Recorded[] = [];
    const bothRunning = { lost: deferred(), kept: deferred() };
    const finish = deferred();
    const logger = new MemoryLogger();
    // Heartbeats are far apart: the worker does not hear of the cancel before the complete.
    const w = worker(queue, {
      concurrency: 2,
      heartbeatIntervalSeconds: 10,
      fetch: recordingFetch(requests),
      logger,
    }).handle<{ role: "lost" | "kept" }>("pair", async (ctx) => {
      bothRunning[ctx.payload.role].resolve();
      await finish.promise; // both return in the same turn
      return { role: ctx.payload.role };
    });
    const lost = await client.enqueue({ queue, type: "pair", payload: { role: "lost" } });
    const kept = await client.enqueue({ queue, type: "pair", payload: { role: "kept" } });
    running(w, t);
    await Promise.all([bothRunning.lost.promise, bothRunning.kept.promise]);
    await client.cancelJob(lost.id);
    finish.resolve();
    const done = await eventually("the kept job to succeed", async () => {
      const job = await client.getJob(kept.id);
      return job.status === "succeeded" ? job : undefined;
    });
    assert.deepEqual(done.result, { role: "kept" });
    const completes = requests.filter((r) => r.line === "POST /v1/complete");
    assert.deepEqual(completes.map(ids), [[lost.id, kept.id].sort((a, b) => a - b)]);
    const gone = await client.getJob(lost.id);
    assert.equal(gone.status, "cancelled");
    assert.equal(gone.result, null);
    await eventually("the worker to let go of both", () => w.runningJobIds.length === 0 || undefined);
    // The service's answer for that item alone said no; the worker took it as such.
    const refused = `complete of job ${lost.id} refused: was cancelled`;
    assert.ok(logger.lines.some((line) => line.includes(refused)), logger.lines.join("\n"));
    assert.equal(requests.filter((r) => r.line === "POST /v1/fail").length, 0);
  });

  test("a result the service refuses fails its own job; its batch mate completes", async (t) => {
    const queue = uniqueQueue("shared-refused");
    const requests: Recorded[] = [];
    const started = { big: deferred(), small: deferred() };
    const finish = deferred();
    const w = worker(queue, { concurrency: 2, fetch: recordingFetch(requests) }).handle<{
      size: "big" | "small";
    }>("result", async (ctx) => {
      started[ctx.payload.size].resolve();
      await finish.promise; // both return in the same turn
      // Past the service's 1 MiB body limit: the shared request is refused with a 413.
      return ctx.payload.size === "big" ? "x".repeat(2 * 1024 * 1024) : "small";
    });
    const big = await client.enqueue({ queue, type: "result", payload: { size: "big" } });
    const small = await client.enqueue({ queue, type: "result", payload: { size: "small" } });
    running(w, t);
    await Promise.all([started.big.promise, started.small.promise]);
    finish.resolve();
    const kept = await eventually("the small result to be stored", async () => {
      const job = await client.getJob(small.id);
      return job.status === "succeeded" ? job : undefined;
    });
    assert.equal(kept.result, "small");
    const dead = await eventually("the big result's job to be dead", async () => {
      const job = await client.getJob(big.id);
      return job.status === "dead" ? job : undefined;
    });
    assert.match(dead.last_error ?? "", /complete refused/);
    const completes = requests.filter((r) => r.line === "POST /v1/complete").map(ids);
    assert.deepEqual(completes[0], [big.id, small.id].sort((a, b) => a - b), "one shared first");
  });

  test("a stop during a shared complete hands back what its claim took, once", async (t) => {
    const queue = uniqueQueue("shared-stop");
    const requests: Recorded[] = [];
    let w: Worker | undefined;
    const fetcher = recordingFetch(requests, (request) => {
      // The stop begins while the first complete (claiming the next jobs) is in flight.
      if (request.line === "POST /v1/complete" && request.body?.claim_next !== undefined) {
        w?.stop();
      }
    });
    w = worker(queue, { concurrency: 2, fetch: fetcher }).handle("noop", async () => null);
    const batch = await client.enqueueBatchIds(
      Array.from({ length: 6 }, () => ({ queue, type: "noop" })),
    );
    await running(w, t);
    const completed = requests.filter((r) => r.line === "POST /v1/complete").flatMap(ids);
    const released = requests.filter((r) => r.line === "POST /v1/release").flatMap(ids);
    assert.equal(completed.length, 2, `completed ${completed.join(",")}`);
    assert.equal(released.length, 2, `released ${released.join(",")}`);
    assert.equal(new Set(released).size, released.length, "no job released twice");
    assert.ok(released.every((id) => !completed.includes(id)));
    for (const id of batch.ids) {
      const job = await client.getJob(id);
      if (completed.includes(id)) assert.equal(job.status, "succeeded");
      else {
        assert.equal(job.status, "pending", `job ${id}`);
        assert.equal(job.attempts, 0, "a release charges no attempt");
      }
    }
  });
});
