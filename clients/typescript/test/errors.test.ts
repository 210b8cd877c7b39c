/** How errors are described to the service and classified for retries (no server needed). */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { Backoff, retryDelay } from "../src/retry.js";

import {
  errorDetail,
  JobContext,
  JobqError,
  LeaseLost,
  StopRequested,
  TransportError,
  type ClaimedJob,
} from "../src/index.js";

class Unnamed extends Error {}

describe("errorDetail", () => {
  test("names the error by its name, or its class when the name is the generic one", () => {
    assert.equal(errorDetail(new TypeError("x")).type, "TypeError");
    assert.equal(errorDetail(new Unnamed("x")).type, "Unnamed");
    assert.equal(errorDetail(new LeaseLost(1)).type, "LeaseLost");
  });

  test("keeps the head of a long stack, where the message and the top frames are", () => {
    const error = new Error("deep");
    error.stack = `Error: deep\n${"    at frame (file.js:1:1)\n".repeat(2000)}`;
    const detail = errorDetail(error);
    assert.equal(detail.traceback?.length, 16000);
    assert.ok(detail.traceback?.startsWith("Error: deep\n"));
  });

  test("describes a thrown value that is not an Error", () => {
    assert.deepEqual(errorDetail({ code: 7 }), { type: "NonError", message: 'thrown: {"code":7}' });
  });
});

describe("errors", () => {
  test("a JobqError says whether repeating may help", () => {
    const problem = {
      type: "about:blank",
      title: "Service Unavailable",
      status: 503,
      detail: "retry",
    };
    assert.equal(new JobqError(503, problem).transient, true);
    assert.equal(new JobqError(429, { ...problem, status: 429 }).transient, true);
    assert.equal(new JobqError(422, { ...problem, status: 422 }).transient, false);
    assert.equal(new JobqError(503, problem).message, "503 Service Unavailable: retry");
  });

  test("a retry waits the Retry-After the service asked for, else backs off", () => {
    const problem = { type: "about:blank", title: "Too Many Requests", status: 429, detail: "" };
    const backoff = new Backoff();
    assert.equal(retryDelay(new JobqError(429, problem, 3), backoff), 3);
    assert.equal(retryDelay(new JobqError(429, problem, 3600), backoff), 60);
    const first = retryDelay(new TransportError("x", "ECONNRESET"), backoff);
    assert.ok(first >= 0.1 && first <= 0.2, String(first));
  });

  test("a TransportError says whether the connection broke before an answer", () => {
    assert.equal(new TransportError("x", "ECONNRESET").dropped, true);
    assert.equal(new TransportError("x", "UND_ERR_SOCKET").dropped, true);
    assert.equal(new TransportError("x", "TIMEOUT").dropped, false);
    assert.equal(new TransportError("x", "ECONNREFUSED").neverSent, true);
  });
});

describe("JobContext outside a worker", () => {
  const job = {
    id: 7,
    type: "t",
    attempt: 2,
    payload: { a: 1 },
    checkpoint: { n: 3 },
  } as unknown as ClaimedJob;

  test("records checkpoints, and once stopping rejects after saving", async () => {
    const ctx = new JobContext<{ a: number }>(job);
    assert.equal(ctx.payload.a, 1);
    assert.deepEqual(ctx.checkpoint, { n: 3 });
    await ctx.saveCheckpoint({ n: 4 });
    ctx.markStopping();
    await assert.rejects(ctx.saveCheckpoint({ n: 5 }), StopRequested);
    assert.deepEqual(ctx.checkpoint, { n: 5 });
  });

  test("after an abort, saving rejects with the abort's reason", async () => {
    const ctx = new JobContext(job);
    const lost = new LeaseLost(7, { cancelled: true });
    ctx.abort(lost);
    assert.equal(ctx.signal.aborted, true);
    assert.equal(ctx.cancelled, true);
    await assert.rejects(ctx.saveCheckpoint({}), (error) => error === lost);
  });
});
