/**
 * `Client`: the producer calls (enqueue, batches, workflows), reading and awaiting jobs, and the
 * raw worker-protocol calls of the jobq HTTP API.
 */

import { randomBytes } from "node:crypto";

import { WaitTimeout, WorkflowWaitTimeout, JobqError } from "./errors.js";
import { Backoff, isTransient, retryDelay, sleep } from "./retry.js";
import { Transport } from "./transport.js";
import type {
  BatchCallback,
  BatchIds,
  CallOptions,
  ClaimedJob,
  ClaimNext,
  ClaimOptions,
  CompleteItem,
  CreateWorkflow,
  EnqueueRequest,
  FailItem,
  HeartbeatItem,
  Job,
  JobBatch,
  JobEventPage,
  JobPage,
  JobStatus,
  LeaseResult,
  Logger,
  ReleaseItem,
  SettleResults,
  Workflow,
  WorkflowChange,
} from "./types.js";

export const DEFAULT_BASE_URL = "http://127.0.0.1:8000";
const USER_AGENT = "jobq-client-ts/0.1.0";
/** The longest `wait_seconds` one `GET /v1/jobs/{id}` may ask for (the service's limit); a
 * longer wait is several of them. */
export const WAIT_SECONDS_MAX = 20;
const FINISHED: ReadonlySet<JobStatus> = new Set(["succeeded", "dead", "cancelled"]);
const WORKFLOW_FINISHED: ReadonlySet<string> = new Set(["succeeded", "failed", "cancelled"]);
// An unfinished job answered well before the wait asked for (an instance shutting down, say):
// pause before asking again, so the loop never spins.
const EARLY_ANSWER_PAUSE_FIRST_SECONDS = 0.1;
const EARLY_ANSWER_PAUSE_MAX_SECONDS = 1;

export interface ClientOptions {
  /** The service's base URL; default `http://127.0.0.1:8000`. */
  baseUrl?: string;
  /** An API key, sent as `Authorization: Bearer <key>` (needed once the service has keys). */
  apiKey?: string;
  /** How long one request may take before it is given up, in seconds (a long-poll gets its
   * wait on top); default 30. */
  timeoutSeconds?: number;
  /** How many times a transient failure of a request that is safe to repeat is retried after a
   * backoff (5xx, 408, 429 honouring `Retry-After`, timeouts, refused connections); default 3.
   * A connection dropped before the answer is sent again at once besides. */
  retries?: number;
  /** A `fetch` to send with; by default requests go over Node's `http` with a keep-alive
   * agent of the client's own. */
  fetch?: typeof fetch;
  /** The most connections to the service open at once, each kept alive between requests
   * (without a `fetch`); default unlimited, a worker's `min(concurrency, 16) + 4`. */
  connections?: number;
  /** Where to log retries and the worker's doings; default: warnings and errors to stderr. */
  logger?: Logger;
}

/** Options of `wait` and `waitWorkflow`. */
export interface WaitOptions extends CallOptions {
  /** How long to wait in all, in seconds; then `WaitTimeout` (the job goes on). */
  timeoutSeconds: number;
  /** The longest single long-poll, in seconds (at most 20, the service's limit; the default). */
  pollSeconds?: number;
}

/** Filters of `listJobs`. */
export interface ListJobsOptions extends CallOptions {
  queue?: string;
  status?: JobStatus | "retrying";
  type?: string;
  limit?: number;
  /** The previous page's `next_cursor`. */
  after?: string;
}

/** Options of the lease calls that settle jobs (complete, fail, release). */
export interface SettleOptions extends CallOptions {
  /** Claim the worker's next jobs in the same request; they come back as `claimed`. */
  claimNext?: ClaimNext;
}

/** Warnings and errors to stderr, so stdout stays the program's own. */
export const stderrLogger: Logger = {
  debug: () => undefined,
  info: () => undefined,
  warn: (message) => process.stderr.write(`jobq: ${message}\n`),
  error: (message) => process.stderr.write(`jobq: ${message}\n`),
};

/** A key for one logical enqueue (or workflow create), so that sending it again can never
 * create a second job (or workflow). */
export function newIdempotencyKey(): string {
  return `auto:${randomBytes(16).toString("base64url")}`;
}

/**
 * A client of the jobq API: enqueue, read, await results, cancel, retry, workflows, and the
 * worker-protocol calls.
 *
 * Every error answer rejects with `JobqError` (status and problem details); no answer at all
 * rejects with `TransportError`, once the retries that are safe were spent (see `retries`).
 */
export class Client {
  protected readonly transport: Transport;

  constructor(options: ClientOptions = {}) {
    const timeoutSeconds = options.timeoutSeconds ?? 30;
    const retries = options.retries ?? 3;
    if (!(timeoutSeconds > 0)) throw new RangeError("timeoutSeconds must be > 0");
    if (!Number.isInteger(retries) || retries < 0) {
      throw new RangeError("retries must be an integer >= 0");
    }
    const connections = options.connections;
    if (connections !== undefined && !(Number.isInteger(connections) && connections >= 1)) {
      throw new RangeError("connections must be an integer >= 1");
    }
    this.transport = new Transport({
      baseUrl: options.baseUrl ?? DEFAULT_BASE_URL,
      apiKey: options.apiKey,
      timeoutSeconds,
      retries,
      fetch: options.fetch,
      connections,
      logger: options.logger ?? stderrLogger,
      userAgent: USER_AGENT,
    });
  }

  // -- producers ---------------------------------------------------------------------------

  /**
   * Enqueues one job; answers it (201: created; an idempotent replay answers the job the key
   * first created). Without an `idempotency_key` the call makes one of its own and sends it on
   * every retry, so a request repeated after its connection broke creates one job.
   */
  async enqueue(job: EnqueueRequest, options: CallOptions = {}): Promise<Job> {
    return this.transport.request<Job>("POST", "/v1/jobs", {
      body: withKey(job),
      repeatable: true,
      signal: options.signal,
    });
  }

  /**
   * Enqueues many jobs in one transaction (all or nothing); answers them in order. Each job
   * (and the `callback`) without an `idempotency_key` gets one of its own, as in `enqueue`.
   *
   * `callback` adds one job that waits for the whole batch: due once all of it succeeded
   * (`when: "all_succeeded"`, the default) or ended at all (`"all_finished"`); its handler finds
   * the counts and the failed ids in `ctx.parents`.
   */
  async enqueueBatch(
    jobs: EnqueueRequest[],
    options: CallOptions & { callback?: BatchCallback } = {},
  ): Promise<JobBatch> {
    return this.transport.request<JobBatch>("POST", "/v1/jobs/batch", {
      body: batchBody(jobs, options.callback),
      repeatable: true,
      signal: options.signal,
    });
  }

  /**
   * `enqueueBatch` answered leanly (`?answer=ids`): the jobs' ids in the order sent, whether
   * this call created each (`false`: its idempotency key's job existed already), and the
   * callback's id. The service renders no job, which makes large batches cheaper on both sides.
   */
  async enqueueBatchIds(
    jobs: EnqueueRequest[],
    options: CallOptions & { callback?: BatchCallback } = {},
  ): Promise<BatchIds> {
    return this.transport.request<BatchIds>("POST", "/v1/jobs/batch", {
      body: batchBody(jobs, options.callback),
      query: { answer: "ids" },
      repeatable: true,
      signal: options.signal,
    });
  }

  /** One job by id (404 rejects with `JobqError`). */
  async getJob(jobId: number, options: CallOptions = {}): Promise<Job> {
    return this.transport.request<Job>("GET", `/v1/jobs/${idOf(jobId)}`, {
      signal: options.signal,
    });
  }

  /** One page of jobs, newest first; pass `next_cursor` as `after` for the next. */
  async listJobs(options: ListJobsOptions = {}): Promise<JobPage> {
    const { queue, status, type, limit, after, signal } = options;
    return this.transport.request<JobPage>("GET", "/v1/jobs", {
      query: { queue, status, type, limit, after },
      signal,
    });
  }

  /** One page of a job's history, oldest first (a failure's event carries its stack). */
  async jobEvents(
    jobId: number,
    options: CallOptions & { limit?: number; after?: string } = {},
  ): Promise<JobEventPage> {
    return this.transport.request<JobEventPage>("GET", `/v1/jobs/${idOf(jobId)}/events`, {
      query: { limit: options.limit, after: options.after },
      signal: options.signal,
    });
  }

  /**
   * Waits until the job is finished (`succeeded`, `dead` or `cancelled`); answers it.
   *
   * Long-polls `GET /v1/jobs/{id}?wait_seconds=` in rounds of at most `pollSeconds` until the
   * job is finished or `timeoutSeconds` have passed; the service answers each round the moment
   * the job finishes. A dead or cancelled job is answered like a succeeded one: look at
   * `status` (and `result`, `last_error`).
   *
   * Rejects with `WaitTimeout` (carrying the job as last seen) when the time runs out: the job
   * goes on, and waiting again is fine. Rejects with `JobqError` for an error answer that
   * repeating will not mend (404: no such job); transient failures are retried with a backoff
   * within the time.
   */
  async wait(jobId: number, options: WaitOptions): Promise<Job> {
    const { timeoutSeconds, pollSeconds, signal } = checkWait(options);
    const path = `/v1/jobs/${idOf(jobId)}`;
    const deadline = now() + timeoutSeconds;
    const failures = new Backoff();
    let job: Job | undefined;
    let early = EARLY_ANSWER_PAUSE_FIRST_SECONDS;
    for (;;) {
      const round = Math.round(Math.max(0, Math.min(deadline - now(), pollSeconds)) * 1000) / 1000;
      const asked = now();
      try {
        job = await this.transport.request<Job>("GET", path, {
          query: { wait_seconds: round },
          waitSeconds: round,
          retries: 0, // this loop retries, within the deadline
          signal,
        });
      } catch (error) {
        if (signal?.aborted || !isTransient(error)) throw error;
        const delay = retryDelay(error, failures);
        if (now() + delay >= deadline) throw new WaitTimeout(jobId, timeoutSeconds, job, error);
        await sleep(delay, signal);
        continue;
      }
      failures.reset();
      if (FINISHED.has(job.status)) return job;
      const answered = now();
      if (answered >= deadline) throw new WaitTimeout(jobId, timeoutSeconds, job);
      if (answered - asked < 0.9 * round) {
        await sleep(Math.min(early, deadline - answered), signal);
        early = Math.min(early * 2, EARLY_ANSWER_PAUSE_MAX_SECONDS);
      } else {
        early = EARLY_ANSWER_PAUSE_FIRST_SECONDS;
      }
    }
  }

  /**
   * Enqueues one job (as `enqueue`) and waits for it to finish (as `wait`); `timeoutSeconds`
   * covers the wait. On `WaitTimeout` the job stays enqueued; with an `idempotency_key`,
   * calling again waits for the same job instead of adding one.
   */
  async enqueueAndWait(job: EnqueueRequest, options: WaitOptions): Promise<Job> {
    const enqueued = await this.enqueue(job, { ...optionalSignal(options.signal) });
    if (FINISHED.has(enqueued.status)) return enqueued; // a replay of a job that finished
    return this.wait(enqueued.id, options);
  }

  /** Cancels a job that has not finished; answers it (409 when its state does not allow it). */
  async cancelJob(jobId: number, options: CallOptions = {}): Promise<Job> {
    return this.transport.request<Job>("POST", `/v1/jobs/${idOf(jobId)}/cancel`, {
      signal: options.signal,
    });
  }

  /** Moves a dead, cancelled or succeeded job back to pending; answers it (409 otherwise). */
  async retryJob(jobId: number, options: CallOptions = {}): Promise<Job> {
    return this.transport.request<Job>("POST", `/v1/jobs/${idOf(jobId)}/retry`, {
      signal: options.signal,
    });
  }

  // -- workflows ---------------------------------------------------------------------------

  /**
   * Creates a workflow: every step's job in one transaction; answers the workflow. Steps
   * without `after` are due at once; each other one waits until its parents end. A cycle, a
   * duplicate or an unknown step name rejects with `JobqError` 422 and creates nothing.
   *
   * Without an `idempotency_key` the call makes one of its own and sends it on every retry, so
   * a request repeated after its connection broke creates one workflow. A key of the caller's
   * own stands for the workflow it made: the same key with the same request answers that
   * workflow again; with another request it rejects with `JobqError` 422.
   */
  async createWorkflow(workflow: CreateWorkflow, options: CallOptions = {}): Promise<Workflow> {
    return this.transport.request<Workflow>("POST", "/v1/workflows", {
      body: withKey(workflow),
      repeatable: true,
      signal: options.signal,
    });
  }

  /** One workflow with each step's job as it is now (404 rejects with `JobqError`). */
  async getWorkflow(workflowId: number, options: CallOptions = {}): Promise<Workflow> {
    return this.transport.request<Workflow>("GET", `/v1/workflows/${idOf(workflowId)}`, {
      signal: options.signal,
    });
  }

  /** Cancels every open step of a workflow (a running one's lease ends at once). */
  async cancelWorkflow(workflowId: number, options: CallOptions = {}): Promise<WorkflowChange> {
    return this.transport.request<WorkflowChange>(
      "POST",
      `/v1/workflows/${idOf(workflowId)}/cancel`,
      { signal: options.signal },
    );
  }

  /** Puts every dead or cancelled step back, so the graph resumes where it failed. */
  async retryWorkflow(workflowId: number, options: CallOptions = {}): Promise<WorkflowChange> {
    return this.transport.request<WorkflowChange>(
      "POST",
      `/v1/workflows/${idOf(workflowId)}/retry`,
      { signal: options.signal },
    );
  }

  /**
   * Waits until the workflow is no longer `running`; answers it (look at `state`).
   *
   * Reads the workflow, then long-polls (as `wait`) the job of its last open step, and reads
   * the workflow again once that job finished, so a chain costs one long-poll, not a loop of
   * reads. Rejects with `WorkflowWaitTimeout` (carrying the workflow as last seen) when the
   * time runs out; transient failures are retried within the time.
   */
  async waitWorkflow(workflowId: number, options: WaitOptions): Promise<Workflow> {
    const { timeoutSeconds, pollSeconds, signal } = checkWait(options);
    const deadline = now() + timeoutSeconds;
    const failures = new Backoff();
    let workflow: Workflow | undefined;
    for (;;) {
      try {
        workflow = await this.transport.request<Workflow>(
          "GET",
          `/v1/workflows/${idOf(workflowId)}`,
          { retries: 0, signal },
        );
      } catch (error) {
        if (signal?.aborted || !isTransient(error)) throw error;
        const delay = retryDelay(error, failures);
        if (now() + delay >= deadline) {
          throw new WorkflowWaitTimeout(workflowId, timeoutSeconds, workflow, error);
        }
        await sleep(delay, signal);
        continue;
      }
      failures.reset();
      if (WORKFLOW_FINISHED.has(workflow.state)) return workflow;
      const remaining = deadline - now();
      if (remaining <= 0) throw new WorkflowWaitTimeout(workflowId, timeoutSeconds, workflow);
      const open = openStepJob(workflow);
      if (open === undefined) continue; // every step ended between two reads: read again
      try {
        await this.wait(open, {
          timeoutSeconds: remaining,
          pollSeconds,
          ...optionalSignal(signal),
        });
      } catch (error) {
        if (error instanceof WaitTimeout) {
          throw new WorkflowWaitTimeout(workflowId, timeoutSeconds, workflow, error);
        }
        // A step's job deleted meanwhile: the next read of the workflow tells.
        if (!(error instanceof JobqError && error.status === 404)) throw error;
      }
    }
  }

  // -- worker protocol ---------------------------------------------------------------------

  /**
   * Leases up to `max_jobs` due jobs of `queues`, long-polling up to `wait_seconds` when none
   * is due. Never sent again on a broken connection: the first claim may have leased jobs whose
   * answer was lost; those come back when their leases expire.
   */
  async claim(
    workerId: string,
    claim: ClaimOptions,
    options: CallOptions = {},
  ): Promise<ClaimedJob[]> {
    const answer = await this.transport.request<{ jobs: ClaimedJob[] }>("POST", "/v1/claim", {
      body: { worker_id: workerId, ...claim },
      waitSeconds: claim.wait_seconds ?? 0,
      repeatable: false,
      signal: options.signal,
    });
    return answer.jobs;
  }

  /**
   * Extends held leases, saving any `checkpoint` / `progress`; answers one result per item.
   * A result `{ok: false}` (`cancelled: true` when the job was cancelled) means the caller must
   * stop working on that job.
   */
  async heartbeat(
    workerId: string,
    leases: HeartbeatItem[],
    options: CallOptions = {},
  ): Promise<LeaseResult[]> {
    const answer = await this.settle("heartbeat", workerId, leases, options);
    return answer.results;
  }

  /** Completes held jobs with their results; answers per item (and what `claimNext` claimed). */
  async complete(
    workerId: string,
    leases: CompleteItem[],
    options: SettleOptions = {},
  ): Promise<SettleResults> {
    return this.settle("complete", workerId, leases, options);
  }

  /** Fails the attempts of held jobs: retried after a backoff, or dead; answers per item. */
  async fail(
    workerId: string,
    leases: FailItem[],
    options: SettleOptions = {},
  ): Promise<SettleResults> {
    return this.settle("fail", workerId, leases, options);
  }

  /**
   * Hands held jobs back without charging the attempt (after `delay_seconds`); a `checkpoint`
   * replaces the saved one, and without one the saved one is kept. Answers per item.
   */
  async release(
    workerId: string,
    leases: ReleaseItem[],
    options: SettleOptions = {},
  ): Promise<SettleResults> {
    return this.settle("release", workerId, leases, options);
  }

  private async settle(
    operation: "heartbeat" | "complete" | "fail" | "release",
    workerId: string,
    leases: object[],
    options: SettleOptions,
  ): Promise<SettleResults> {
    const body: Record<string, unknown> = { worker_id: workerId, leases };
    if (options.claimNext !== undefined) body["claim_next"] = options.claimNext;
    return this.transport.request<SettleResults>("POST", `/v1/${operation}`, {
      body,
      waitSeconds: options.claimNext?.wait_seconds ?? 0,
      // Safe to send twice: the same transition with the same lease is answered as a replay,
      // and a second heartbeat only extends the lease again. Not with a claim riding along: as
      // a claim, that is never sent again.
      repeatable: options.claimNext === undefined,
      signal: options.signal,
    });
  }
}

function withKey<T extends { idempotency_key?: string | null }>(job: T): T {
  return job.idempotency_key == null ? { ...job, idempotency_key: newIdempotencyKey() } : job;
}

/** A batch as the wire takes it, every job (and the callback) with an idempotency key. */
function batchBody(jobs: EnqueueRequest[], callback: BatchCallback | undefined): object {
  return callback === undefined
    ? { jobs: jobs.map(withKey) }
    : { jobs: jobs.map(withKey), callback: withKey(callback) };
}

/** An id as a path segment; anything but a positive integer is refused before it is sent. */
function idOf(id: number): string {
  if (!Number.isSafeInteger(id) || id < 1) throw new TypeError(`not an id: ${String(id)}`);
  return String(id);
}

function checkWait(options: WaitOptions): Required<Omit<WaitOptions, "signal">> & CallOptions {
  const { timeoutSeconds, pollSeconds = WAIT_SECONDS_MAX } = options;
  if (!(timeoutSeconds >= 0)) throw new RangeError("timeoutSeconds must be >= 0");
  if (!(pollSeconds > 0 && pollSeconds <= WAIT_SECONDS_MAX)) {
    throw new RangeError(`pollSeconds must be in (0, ${WAIT_SECONDS_MAX}]`);
  }
  return { timeoutSeconds, pollSeconds, ...optionalSignal(options.signal) };
}

function optionalSignal(signal: AbortSignal | undefined): CallOptions {
  return signal === undefined ? {} : { signal };
}

/** The job id of the last step still open, or `undefined`: the last one in creation order is
 * the deepest, so waiting for it usually waits out the others. */
function openStepJob(workflow: Workflow): number | undefined {
  for (let i = workflow.steps.length - 1; i >= 0; i -= 1) {
    const job = workflow.steps[i]?.job;
    if (job !== undefined && !FINISHED.has(job.status)) return job.id;
  }
  return undefined;
}

function now(): number {
  return performance.now() / 1000;
}
