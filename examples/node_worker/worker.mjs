// A jobq worker in Node.js with nothing but the standard library (built-in fetch, Node >= 20.3).
//
//     JOBQ_URL=http://127.0.0.1:8000 node examples/node_worker/worker.mjs default other-queue
//
// It long-polls POST /v1/claim, handles the job type "reverse" (the result is the payload string
// reversed), fails every other type with retryable=false (so it goes to "dead" at once), and
// completes the rest in one POST /v1/complete per batch, which asks for the next batch
// (claim_next): a busy worker makes one request per batch. Jobs here take microseconds, so it
// sends no heartbeats. SIGTERM or SIGINT aborts the pending long-poll and exits with status 0 once
// the batch in hand is answered (jobs the last complete handed over are released).
//
// Settings (environment): JOBQ_URL (default http://127.0.0.1:8000), JOBQ_QUEUES (comma separated,
// used when no queue is given as an argument; default "default"), JOBQ_WORKER_ID (default
// host:pid), JOBQ_WAIT_SECONDS (long-poll, default 20), JOBQ_MAX_JOBS (default 10),
// JOBQ_LEASE_SECONDS (default: each job's own).

import os from "node:os";
import process from "node:process";

const baseUrl = (process.env.JOBQ_URL ?? "http://127.0.0.1:8000").replace(/\/+$/, "");
const argQueues = process.argv.slice(2).filter((q) => q.length > 0);
const queues =
  argQueues.length > 0
    ? argQueues
    : (process.env.JOBQ_QUEUES ?? "default").split(",").map((q) => q.trim()).filter(Boolean);
const workerId = process.env.JOBQ_WORKER_ID ?? `${os.hostname()}:${process.pid}`;
const waitSeconds = Number(process.env.JOBQ_WAIT_SECONDS ?? "20");
const maxJobs = Number(process.env.JOBQ_MAX_JOBS ?? "10");
const leaseSeconds = process.env.JOBQ_LEASE_SECONDS ? Number(process.env.JOBQ_LEASE_SECONDS) : null;
const CALL_TIMEOUT_MS = 15_000;
const RETRY_DELAY_MS = 1_000;

/** A thrown value as POST /v1/fail takes it: type, message and stack (the service keeps its last 16,000 characters). */
function errorDetail(error) {
  if (!(error instanceof Error)) return { type: typeof error, message: String(error) };
  return { type: (error.name || "Error").slice(0, 200), message: error.message ?? "", traceback: error.stack ?? null };
}

/** Raised by a handler for an error that another attempt would not fix. */
class NonRetryableError extends Error {
  name = "NonRetryableError";
}

/** Job type -> handler(payload) -> result (any JSON). */
const handlers = {
  reverse(payload) {
    if (typeof payload !== "string") {
      throw new NonRetryableError(`reverse wants a string payload, got ${JSON.stringify(payload)}`);
    }
    return [...payload].reverse().join(""); // by code point, as Python's s[::-1]
  },
};

// Shutdown: one controller aborts the long-poll and any pause between retries.
const shutdown = new AbortController();
for (const signal of ["SIGTERM", "SIGINT"]) {
  process.on(signal, () => {
    if (!shutdown.signal.aborted) log(`${signal}: stopping`);
    shutdown.abort();
  });
}

function log(message) {
  console.log(`${new Date().toISOString()} ${workerId} ${message}`);
}

/** Sleeps ``ms`` unless shutdown comes first. */
function pause(ms) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    shutdown.signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    }, { once: true });
  });
}

class HttpError extends Error {
  constructor(status, body) {
    super(`HTTP ${status}: ${body.slice(0, 500)}`);
    this.status = status;
  }
}

/** POSTs JSON and answers the parsed answer; throws HttpError on a non-2xx status. */
async function post(path, body, { timeoutMs = CALL_TIMEOUT_MS, abortable = false } = {}) {
  const signals = [AbortSignal.timeout(timeoutMs)];
  if (abortable) signals.push(shutdown.signal);
  const response = await fetch(`${baseUrl}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", accept: "application/json" },
    body: JSON.stringify(body),
    signal: AbortSignal.any(signals),
  });
  const text = await response.text();
  if (!response.ok) throw new HttpError(response.status, text);
  return JSON.parse(text);
}

/** Long-polls for up to ``maxJobs`` jobs; answers [] when the wait ends empty or on shutdown. */
async function claim() {
  const body = { worker_id: workerId, queues, max_jobs: maxJobs, wait_seconds: waitSeconds };
  if (leaseSeconds !== null) body.lease_seconds = leaseSeconds;
  try {
    const answer = await post("/v1/claim", body, {
      timeoutMs: waitSeconds * 1000 + CALL_TIMEOUT_MS,
      abortable: true, // SIGTERM should not wait for the long-poll to run out
    });
    return answer.jobs;
  } catch (error) {
    if (shutdown.signal.aborted) return [];
    if (error instanceof HttpError && error.status >= 400 && error.status < 500) throw error;
    log(`claim failed (${error.message}); retrying in ${RETRY_DELAY_MS} ms`);
    await pause(RETRY_DELAY_MS);
    return [];
  }
}

/**
 * Sends one lease call (complete, fail or release) for a batch; a lost answer only means a later
 * retry. With ``claimNext`` the call also claims the next jobs, without waiting: answers them.
 */
async function leaseCall(op, leases, claimNext = false) {
  if (leases.length === 0) return [];
  const body = { worker_id: workerId, leases };
  if (claimNext) {
    body.claim_next = { queues, max_jobs: maxJobs };
    if (leaseSeconds !== null) body.claim_next.lease_seconds = leaseSeconds;
  }
  try {
    const { results, claimed } = await post(`/v1/${op}`, body);
    for (const result of results) {
      if (!result.ok) log(`${op} job ${result.job_id}: ${result.error} (another worker owns it now)`);
    }
    return claimed?.jobs ?? [];
  } catch (error) {
    // The leases stay ours until they expire; the service then hands the jobs out again.
    log(`${op} failed (${error.message}); the jobs come back when their leases expire`);
    return [];
  }
}

const leaseRefs = (jobs) => jobs.map((job) => ({ job_id: job.id, lease_id: job.lease_id }));

async function main() {
  log(`polling ${baseUrl} for queues ${queues.join(", ")}`);
  let jobs = [];
  while (!shutdown.signal.aborted) {
    if (jobs.length === 0) {
      jobs = await claim();
      continue;
    }
    const done = [];
    const failed = [];
    for (const job of jobs) {
      const ref = { job_id: job.id, lease_id: job.lease_id };
      const handler = Object.hasOwn(handlers, job.type) ? handlers[job.type] : null;
      if (handler === null) {
        failed.push({ ...ref, error: `no handler for job type ${JSON.stringify(job.type)}`, retryable: false });
        continue;
      }
      try {
        done.push({ ...ref, result: await handler(job.payload, job) });
      } catch (error) {
        failed.push({ ...ref, error: errorDetail(error), retryable: !(error instanceof NonRetryableError) });
      }
    }
    await leaseCall("fail", failed);
    jobs = await leaseCall("complete", done, !shutdown.signal.aborted);
    log(`${done.length} done, ${failed.length} failed`);
  }
  await leaseCall("release", leaseRefs(jobs));
  log("stopped");
}

main().then(
  () => process.exit(0),
  (error) => {
    log(`fatal: ${error.message}`);
    process.exit(2);
  },
);
