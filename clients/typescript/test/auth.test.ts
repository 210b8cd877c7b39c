/**
 * Error answers of a service with API keys: 401 and 403 as `JobqError`s carrying the problem.
 *
 * Keys switch authentication on for the whole database, so these tests need a server of their
 * own: `JOBQ_AUTH_URL`, with `JOBQ_AUTH_PRODUCER_KEY` (a producer key) and
 * `JOBQ_AUTH_VIEWER_KEY` (a viewer key: it may read, not enqueue or work). Skipped without them.
 */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { Client, JobqError, Worker } from "../src/index.js";
import { MemoryLogger, uniqueQueue } from "./support.js";

const url = process.env["JOBQ_AUTH_URL"];
const producerKey = process.env["JOBQ_AUTH_PRODUCER_KEY"];
const viewerKey = process.env["JOBQ_AUTH_VIEWER_KEY"];
const configured = url !== undefined && producerKey !== undefined && viewerKey !== undefined;

function client(apiKey?: string): Client {
  return new Client({
    baseUrl: url ?? "",
    logger: new MemoryLogger(),
    ...(apiKey ? { apiKey } : {}),
  });
}

describe(
  "API keys",
  { skip: configured ? false : "JOBQ_AUTH_URL and its keys are not set" },
  () => {
    test("no key is a 401 JobqError with the problem", async () => {
      const error = await client()
        .enqueue({ queue: uniqueQueue("auth"), type: "echo" })
        .catch((e: unknown) => e);
      assert.ok(error instanceof JobqError, String(error));
      assert.equal(error.status, 401);
      assert.equal(error.problem.status, 401);
      assert.match(error.problem.type, /unauthenticated/);
      assert.match(error.detail, /API key/);
      assert.equal(error.transient, false);
    });

    test("a key that may not enqueue is a 403 JobqError", async () => {
      const error = await client(viewerKey)
        .enqueue({ queue: uniqueQueue("auth"), type: "echo" })
        .catch((e: unknown) => e);
      assert.ok(error instanceof JobqError, String(error));
      assert.equal(error.status, 403);
      assert.match(error.detail, /may not enqueue/);
    });

    test("the right key enqueues", async () => {
      const job = await client(producerKey).enqueue({ queue: uniqueQueue("auth"), type: "echo" });
      assert.equal(job.status, "pending");
    });

    test("a worker whose claim is refused for good stops and rejects with the error", async () => {
      const worker = new Worker({
        baseUrl: url ?? "",
        apiKey: viewerKey ?? "",
        queues: [uniqueQueue("auth")],
        handleSignals: false,
        logger: new MemoryLogger(),
      });
      await assert.rejects(
        worker.run(),
        (error) => error instanceof JobqError && error.status === 403,
      );
    });
  },
);
