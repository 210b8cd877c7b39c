/** The Worker against a real server: running handlers, recording failures, heartbeats that lose
 * a lease, checkpoints, and the graceful stop. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  LeaseLost,
  NonRetryableError,
  StopRequested,
  Worker,
  type JobContext,
  type WorkerOptions,
} from "../src/index.js";
import {
  deferred,
  directClient,
  DroppingProxy,
  eventually,
  MemoryLogger,
  running,
  serverUrl,
  uniqueQueue,
} from "./support.js";

const client = directClient();

function worker(queue: string, options: WorkerOptions = {}): Worker {
  return new Worker({
    baseUrl: serverUrl(),
    queues: [queue],
    concurrency: 2,
    leaseSeconds: 3,
    waitSeconds: 1,
    graceSeconds: 5,
    handleSignals: false,
    logger: new MemoryLogger(),
    ...options,
  });
}

/** The job once it has left `running` / `pending` for good (or reached `status`). */
async function settled(
  jobId: number,
  status?: string,
): Promise<Awaited<ReturnType<typeof client.getJob>>> {
  return eventually(`job ${jobId} to be ${status ?? "finished"}`, async () => {
    const job = await client.getJob(jobId);
    const done =
      status === undefined
        ? ["succeeded", "dead", "cancelled"].includes(job.status)
        : job.status === status;
    return done ? job : undefined;
  });
}

class PaymentDeclined extends Error {
  override name = "PaymentDeclined";
}

// Named, so the stack the service records names it.
function chargeCard(): never {
  throw new PaymentDeclined("card 4242 declined", { cause: new Error("issuer said no") });
}

describe("worker", () => {
  test("completes jobs with their handler's result, several in one request", async (t) => {
    const queue = uniqueQueue("complete");
    const proxy = await DroppingProxy.start(serverUrl());
    t.after(() => proxy.close());
    const w = worker(queue, { baseUrl: proxy.url }).handle<{ n: number }>(
      "double",
      async (ctx) => ({
        doubled: ctx.payload.n * 2,
        attempt: ctx.attempt,
      }),
    );
    const batch = await client.enqueueBatch(
      Array.from({ length: 12 }, (_, n) => ({ queue, type: "double", payload: { n } })),
    );
    running(w, t);
    for (const [n, job] of batch.jobs.entries()) {
      const done = await settled(job.id);
      assert.equal(done.status, "succeeded");
      assert.deepEqual(done.result, { doubled: n * 2, attempt: 1 });
    }
    // Both slots' handlers return in the same turn: one request completes the two jobs.
    assert.ok(proxy.count("POST /v1/complete") < 12, `${proxy.count("POST /v1/complete")}`);
    // Settling claims the next jobs in the same request: the claim loop asks only now and then.
    assert.ok(proxy.count("POST /v1/claim") < 6, `${proxy.count("POST /v1/claim")} claims`);
  });

  test("a handler's error is recorded with its type, message and stack", async (t) => {
    const queue = uniqueQueue("fail");
    const w = worker(queue).handle("charge", async () => chargeCard());
    const job = await client.enqueue({ queue, type: "charge", max_attempts: 1 });
    running(w, t);
    const dead = await settled(job.id);
    assert.equal(dead.status, "dead");
    assert.equal(dead.last_error, "PaymentDeclined: card 4242 declined");
    const events = await client.jobEvents(job.id);
    const failed = events.events.find((event) => event.kind === "failed");
    const data = failed?.data as { type: string; error: string; traceback: string };
    assert.equal(data.type, "PaymentDeclined");
    assert.match(data.traceback, /^PaymentDeclined: card 4242 declined\n\s+at chargeCard /);
    assert.match(data.traceback, /Caused by: Error: issuer said no/);
  });

  test("NonRetryableError kills the job on its first attempt", async (t) => {
    const queue = uniqueQueue("non-retryable");
    const w = worker(queue).handle("validate", async () => {
      throw new NonRetryableError("payload is not an order");
    });
    const job = await client.enqueue({ queue, type: "validate", max_attempts: 5 });
    running(w, t);
    const dead = await settled(job.id);
    assert.equal(dead.status, "dead");
    assert.equal(dead.attempts, 1);
    assert.equal(dead.last_error, "NonRetryableError: payload is not an order");
  });

  test("a job of a type without a handler is released for later, not failed", async (t) => {
    const queue = uniqueQueue("unknown");
    const w = worker(queue, { unknownTypeDelaySeconds: 120 }).handle("known", async () => null);
    const job = await client.enqueue({ queue, type: "unknown" });
    running(w, t);
    const released = await settled(job.id, "scheduled");
    assert.equal(released.last_error, null);
    assert.ok(Date.parse(released.run_at) > Date.now() + 60_000, `run_at ${released.run_at}`);
  });

  test("a checkpoint saved through a heartbeat is stored while the handler runs", async (t) => {
    const queue = uniqueQueue("checkpoint");
    const saved = deferred();
    const finish = deferred();
    const w = worker(queue).handle("import", async (ctx) => {
      await ctx.saveCheckpoint({ row: 800 }, { done: 8, total: 20 });
      assert.deepEqual(ctx.checkpoint, { row: 800 });
      saved.resolve();
      await finish.promise;
      return "imported";
    });
    const job = await client.enqueue({ queue, type: "import" });
    running(w, t);
    await saved.promise;
    const during = await client.getJob(job.id);
    assert.equal(during.status, "running");
    assert.deepEqual(during.checkpoint, { row: 800 });
    assert.deepEqual(during.progress, { done: 8, total: 20 });
    finish.resolve();
    assert.equal((await settled(job.id)).result, "imported");
  });

  test("cancelling a running job aborts its signal; the worker never settles it", async (t) => {
    const queue = uniqueQueue("cancel");
    const aborted = deferred<unknown>();
    const w = worker(queue, { leaseSeconds: 3, heartbeatIntervalSeconds: 0.2 }).handle(
      "hang",
      async (ctx) => {
        await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
        aborted.resolve(ctx.signal.reason);
        assert.equal(ctx.cancelled, true);
        return "finished anyway"; // ignored: the job is not this worker's any more
      },
    );
    const job = await client.enqueue({ queue, type: "hang" });
    running(w, t);
    await eventually(
      "the job to run",
      async () => (await client.getJob(job.id)).status === "running" || undefined,
    );
    await client.cancelJob(job.id);
    const reason = await aborted.promise;
    assert.ok(reason instanceof LeaseLost);
    assert.equal(reason.cancelled, true);
    await eventually(
      "the worker to let go of the job",
      () => w.runningJobIds.length === 0 || undefined,
    );
    const after = await client.getJob(job.id);
    assert.equal(after.status, "cancelled");
    assert.equal(after.result, null);
  });

  test("a lease lost while heartbeats could not get through aborts the handler", async (t) => {
    const queue = uniqueQueue("lease-lost");
    const proxy = await DroppingProxy.start(serverUrl());
    t.after(() => proxy.close());
    const reasons: unknown[] = [];
    const firstRunning = deferred();
    const w = worker(queue, {
      baseUrl: proxy.url,
      concurrency: 1,
      leaseSeconds: 2,
      heartbeatIntervalSeconds: 0.3,
    }).handle("work", async (ctx: JobContext) => {
      if (ctx.attempt > 1) return { attempt: ctx.attempt };
      firstRunning.resolve();
      await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
      reasons.push(ctx.signal.reason);
      return { attempt: 1 }; // ignored: the lease is gone
    });
    const job = await client.enqueue({ queue, type: "work" });
    running(w, t);
    await firstRunning.promise;
    proxy.blackhole = true; // heartbeats fail; the lease expires and the reaper takes the job
    await eventually("the reaper to take the job back", async () => {
      const current = await client.getJob(job.id);
      return current.status !== "running" ? current : undefined;
    });
    proxy.blackhole = false; // the next heartbeat hears the lease is gone
    const done = await settled(job.id);
    assert.equal(reasons.length, 1);
    const reason = reasons[0];
    assert.ok(reason instanceof LeaseLost, String(reason));
    assert.equal(reason.cancelled, false);
    assert.equal(done.status, "succeeded");
    assert.deepEqual(done.result, { attempt: 2 }, "the first attempt was never completed");
  });

  test("stop: the next checkpoint save ends the handler and the job is released with it", async (t) => {
    const queue = uniqueQueue("stop");
    const started = deferred();
    const seen: unknown[] = [];
    const w = worker(queue, { graceSeconds: 10 }).handle("chunks", async (ctx: JobContext) => {
      started.resolve();
      for (let n = (ctx.checkpoint as { next?: number } | null)?.next ?? 0; n < 1000; n += 1) {
        await new Promise((resolve) => setTimeout(resolve, 20, undefined));
        try {
          await ctx.saveCheckpoint({ next: n + 1 });
        } catch (error) {
          seen.push(error);
          throw error;
        }
      }
      return "all done";
    });
    const job = await client.enqueue({ queue, type: "chunks" });
    const run = running(w, t);
    await started.promise;
    const stoppedAt = Date.now();
    w.stop();
    await run;
    assert.ok(Date.now() - stoppedAt < 3000, "released at once, not at lease expiry");
    assert.equal(seen.length, 1);
    assert.ok(seen[0] instanceof StopRequested);
    const released = await client.getJob(job.id);
    assert.equal(released.status, "pending");
    assert.equal(released.attempts, 0, "a release charges no attempt");
    const checkpoint = released.checkpoint as { next: number };
    assert.ok(checkpoint.next >= 1, JSON.stringify(checkpoint));

    // The next worker starts where this one stopped.
    const resumed = deferred<unknown>();
    const next = worker(queue).handle("chunks", async (ctx: JobContext) => {
      resumed.resolve(ctx.checkpoint);
      return "resumed";
    });
    running(next, t);
    assert.deepEqual(await resumed.promise, checkpoint);
  });

  test("after the grace period the signal aborts and the job is released with its last checkpoint", async (t) => {
    const queue = uniqueQueue("grace");
    const saved = deferred();
    let reason: unknown;
    const w = worker(queue, { graceSeconds: 0.3 }).handle("stubborn", async (ctx: JobContext) => {
      await ctx.saveCheckpoint({ step: 1 });
      saved.resolve();
      // Never saves again: only the end of the grace period stops it.
      await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
      reason = ctx.signal.reason;
      throw reason;
    });
    const job = await client.enqueue({ queue, type: "stubborn" });
    const run = running(w, t);
    await saved.promise;
    w.stop();
    await run;
    assert.ok(reason instanceof StopRequested, String(reason));
    const released = await client.getJob(job.id);
    assert.equal(released.status, "pending");
    assert.deepEqual(released.checkpoint, { step: 1 });
    assert.equal(released.last_error, null, "released, not failed");
  });

  test("a second stop ends the grace period at once", async (t) => {
    const queue = uniqueQueue("second-stop");
    const started = deferred();
    const w = worker(queue, { graceSeconds: 60 }).handle("slow", async (ctx: JobContext) => {
      started.resolve();
      await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
    });
    const job = await client.enqueue({ queue, type: "slow" });
    const run = running(w, t);
    await started.promise;
    const stoppedAt = Date.now();
    w.stop();
    w.stop();
    await run;
    assert.ok(Date.now() - stoppedAt < 2000);
    assert.equal((await client.getJob(job.id)).status, "pending");
  });
});
