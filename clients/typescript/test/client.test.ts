/** The producer API against a real server: enqueue, batches, idempotency, waits, workflows,
 * and the retries that are safe after a dropped connection. */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  Client,
  JobqError,
  TransportError,
  WaitTimeout,
  WorkflowWaitTimeout,
} from "../src/index.js";
import { directClient, DroppingProxy, MemoryLogger, serverUrl, uniqueQueue } from "./support.js";

/** Every job of a queue (the tests' queues are small). */
async function jobsOf(client: Client, queue: string): Promise<number[]> {
  const page = await client.listJobs({ queue, limit: 500 });
  return page.jobs.map((job) => job.id).sort((a, b) => a - b);
}

/** Claims and completes one job of `queue` with `result`, as a worker would over the raw calls. */
async function completeOne(client: Client, queue: string, result: unknown): Promise<number> {
  const [job] = await client.claim("ts-test-raw", {
    queues: [queue],
    max_jobs: 1,
    wait_seconds: 5,
  });
  assert.ok(job, `a job of ${queue} to claim`);
  const answer = await client.complete("ts-test-raw", [
    { job_id: job.id, lease_id: job.lease_id ?? "", result },
  ]);
  assert.equal(answer.results[0]?.ok, true);
  return job.id;
}

describe("producer", () => {
  const client = directClient();

  test("enqueue, get and wait for the result", async () => {
    const queue = uniqueQueue("enqueue");
    const job = await client.enqueue({ queue, type: "echo", payload: { n: 1 }, priority: 5 });
    assert.equal(job.status, "pending");
    assert.equal(job.queue, queue);
    assert.deepEqual(job.payload, { n: 1 });
    assert.match(job.idempotency_key ?? "", /^auto:[A-Za-z0-9_-]{22}$/);
    assert.equal((await client.getJob(job.id)).priority, 5);

    const waiting = client.wait(job.id, { timeoutSeconds: 10 });
    await completeOne(client, queue, { doubled: 2 });
    const done = await waiting;
    assert.equal(done.status, "succeeded");
    assert.deepEqual(done.result, { doubled: 2 });
  });

  test("enqueueAndWait answers the finished job", async () => {
    const queue = uniqueQueue("enqueue-wait");
    const waiting = client.enqueueAndWait({ queue, type: "echo" }, { timeoutSeconds: 10 });
    const id = await completeOne(client, queue, "ok");
    const done = await waiting;
    assert.equal(done.id, id);
    assert.equal(done.result, "ok");
  });

  test("wait rejects with WaitTimeout carrying the unfinished job", async () => {
    const job = await client.enqueue({ queue: uniqueQueue("timeout"), type: "slow" });
    const started = Date.now();
    const error = await client.wait(job.id, { timeoutSeconds: 0.5 }).catch((e: unknown) => e);
    assert.ok(error instanceof WaitTimeout);
    assert.equal(error.job?.status, "pending");
    assert.ok(Date.now() - started >= 450, "waited out the time");
  });

  test("batch enqueue answers the jobs in order, each with a key of its own", async () => {
    const queue = uniqueQueue("batch");
    const batch = await client.enqueueBatch(
      [1, 2, 3].map((n) => ({ queue, type: "echo", payload: n })),
      { callback: { queue, type: "after-all" } },
    );
    assert.deepEqual(
      batch.jobs.map((job) => job.payload),
      [1, 2, 3],
    );
    assert.equal(new Set(batch.jobs.map((job) => job.idempotency_key)).size, 3);
    assert.equal(batch.callback?.type, "after-all");
    assert.equal(batch.callback?.status, "waiting");
  });

  test("a lean batch answers ids, and whether each job was created", async () => {
    const queue = uniqueQueue("batch-ids");
    const first = await client.enqueue({ queue, type: "echo", idempotency_key: "one" });
    const answer = await client.enqueueBatchIds([
      { queue, type: "echo", idempotency_key: "one" },
      { queue, type: "echo", payload: 2 },
    ]);
    assert.equal(answer.ids[0], first.id);
    assert.deepEqual(answer.created, [false, true]);
    assert.deepEqual(
      await jobsOf(client, queue),
      [...answer.ids].sort((a, b) => a - b),
    );
  });

  test("the same idempotency key answers the same job", async () => {
    const queue = uniqueQueue("idem");
    const first = await client.enqueue({ queue, type: "echo", payload: 1, idempotency_key: "k" });
    const again = await client.enqueue({ queue, type: "echo", payload: 1, idempotency_key: "k" });
    assert.equal(again.id, first.id);
    assert.deepEqual(await jobsOf(client, queue), [first.id]);

    const reused = await client
      .enqueue({ queue, type: "echo", payload: 2, idempotency_key: "k" })
      .catch((e: unknown) => e);
    assert.ok(reused instanceof JobqError);
    assert.equal(reused.status, 422);
    assert.equal(reused.problem.status, 422);
    assert.match(reused.problem.type, /idempotency-key-reused/);
    assert.equal(reused.errors[0]?.["field"], "idempotency_key");
  });

  test("cancel and retry a job; 404 and 409 are JobqErrors", async () => {
    const job = await client.enqueue({ queue: uniqueQueue("cancel"), type: "echo" });
    assert.equal((await client.cancelJob(job.id)).status, "cancelled");
    assert.equal((await client.retryJob(job.id)).status, "pending");
    const conflict = await client.retryJob(job.id).catch((e: unknown) => e);
    assert.ok(conflict instanceof JobqError, String(conflict));
    assert.equal(conflict.status, 409);
    assert.match(conflict.detail, /pending/);
    const missing = await client.getJob(2 ** 52).catch((e: unknown) => e);
    assert.ok(missing instanceof JobqError);
    assert.equal(missing.status, 404);
    assert.equal(missing.transient, false);
  });

  test("a workflow is created, read and awaited", async () => {
    const queue = uniqueQueue("workflow");
    const workflow = await client.createWorkflow({
      name: "two-steps",
      steps: [
        { name: "first", type: "echo", queue },
        { name: "second", type: "echo", queue, after: ["first"] },
      ],
    });
    assert.equal(workflow.state, "running");
    assert.deepEqual(
      workflow.steps.map((step) => step.name),
      ["first", "second"],
    );
    assert.equal((await client.getWorkflow(workflow.id)).id, workflow.id);
    const early = await client
      .waitWorkflow(workflow.id, { timeoutSeconds: 0.2 })
      .catch((e: unknown) => e);
    assert.ok(early instanceof WorkflowWaitTimeout);

    const waiting = client.waitWorkflow(workflow.id, { timeoutSeconds: 15 });
    await completeOne(client, queue, "one");
    await completeOne(client, queue, "two");
    const done = await waiting;
    assert.equal(done.state, "succeeded");
    assert.deepEqual(
      done.steps.map((step) => step.job.result),
      ["one", "two"],
    );
  });
});

describe("retries after a dropped connection", () => {
  let proxy: DroppingProxy;
  let logger: MemoryLogger;
  let client: Client;
  const direct = directClient();

  before(async () => {
    proxy = await DroppingProxy.start(serverUrl());
  });
  after(async () => {
    await proxy.close();
  });

  function throughProxy(): Client {
    logger = new MemoryLogger();
    return new Client({ baseUrl: proxy.url, logger, retries: 0 });
  }

  test("an enqueue whose answer was lost is sent again with its automatic key: one job", async () => {
    client = throughProxy();
    const queue = uniqueQueue("dropped-answer");
    proxy.dropAnswers = 1;
    const job = await client.enqueue({ queue, type: "echo", payload: { once: true } });
    assert.equal(proxy.dropAnswers, 0, "the proxy dropped the first answer");
    assert.equal(proxy.count("POST /v1/jobs"), 2, "the enqueue went out twice");
    assert.deepEqual(await jobsOf(direct, queue), [job.id], "one job exists");
    assert.ok(logger.lines.some((line) => line.includes("connection dropped before an answer")));
    proxy.requests.length = 0;
  });

  test("a batch whose answer was lost is sent again: each job once", async () => {
    client = throughProxy();
    const queue = uniqueQueue("dropped-batch");
    proxy.dropAnswers = 1;
    const batch = await client.enqueueBatch([
      { queue, type: "a" },
      { queue, type: "b" },
    ]);
    assert.equal(proxy.dropAnswers, 0);
    assert.deepEqual(
      await jobsOf(direct, queue),
      batch.jobs.map((job) => job.id).sort((a, b) => a - b),
    );
  });

  test("a workflow create whose answer was lost is sent again with its automatic key: one workflow", async () => {
    client = throughProxy();
    const queue = uniqueQueue("dropped-workflow");
    proxy.requests.length = 0;
    proxy.dropAnswers = 1;
    const workflow = await client.createWorkflow({
      name: "dropped",
      steps: [
        { name: "first", type: "echo", queue },
        { name: "second", type: "echo", queue, after: ["first"] },
      ],
    });
    assert.equal(proxy.dropAnswers, 0, "the proxy dropped the first answer");
    assert.equal(proxy.count("POST /v1/workflows"), 2, "the create went out twice");
    assert.deepEqual(
      await jobsOf(direct, queue),
      workflow.steps.map((step) => step.job.id).sort((a, b) => a - b),
      "one workflow's steps exist",
    );
    // A key of the caller's own stands for the workflow it made.
    const key = `ts-${queue}`;
    const body = {
      name: "keyed",
      idempotency_key: key,
      steps: [{ name: "a", type: "echo", queue }],
    };
    const keyed = await direct.createWorkflow(body);
    assert.equal((await direct.createWorkflow(body)).id, keyed.id);
    proxy.requests.length = 0;
  });

  test("a request on a reused connection reset as it goes out is sent again", async () => {
    client = throughProxy();
    const job = await client.enqueue({ queue: uniqueQueue("reused"), type: "echo" });
    // The next request on a pooled connection is reset. undici hands a connection back to its
    // pool a moment after the answer, so read until a read has gone out on a reused one.
    proxy.dropReused = 1;
    for (let reads = 1; proxy.dropReused > 0; reads += 1) {
      assert.ok(reads <= 100, "no read went out on a reused connection");
      assert.equal((await client.getJob(job.id)).id, job.id);
    }
    assert.ok(logger.lines.some((line) => line.includes("connection dropped before an answer")));
  });

  test("a claim is never sent again: its first try may have leased jobs", async () => {
    client = throughProxy();
    const queue = uniqueQueue("claim-dropped");
    await direct.enqueue({ queue, type: "echo" });
    proxy.requests.length = 0;
    proxy.dropAnswers = 1;
    const error = await client.claim("ts-test", { queues: [queue] }).catch((e: unknown) => e);
    assert.ok(error instanceof TransportError, String(error));
    assert.ok(error.dropped);
    assert.equal(proxy.count("POST /v1/claim"), 1);
  });
});

describe("transient answers", () => {
  test("a refused connection is retried with a backoff, then surfaces as a TransportError", async () => {
    const proxy = await DroppingProxy.start(serverUrl());
    const url = proxy.url;
    await proxy.close(); // nothing listens there any more
    const logger = new MemoryLogger();
    const client = new Client({ baseUrl: url, retries: 2, logger });
    const error = await client.getJob(1).catch((e: unknown) => e);
    assert.ok(error instanceof TransportError, String(error));
    assert.equal(error.code, "ECONNREFUSED");
    assert.equal(logger.lines.filter((line) => line.includes("retrying in")).length, 2);
  });

  test("a caller's signal ends a call at once with its reason", async () => {
    const client = directClient();
    const job = await client.enqueue({ queue: uniqueQueue("abort"), type: "echo" });
    const controller = new AbortController();
    const waiting = client.wait(job.id, { timeoutSeconds: 30, signal: controller.signal });
    const reason = new Error("no longer needed");
    setImmediate(() => controller.abort(reason));
    await assert.rejects(waiting, (error) => error === reason);
  });
});
