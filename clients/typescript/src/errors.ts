/**
 * The client's errors: the service's error answers, failed transports, waits that timed out,
 * a handler's verdict, and the two ways a worker stops a handler.
 *
 * Every class sets `name`, so `error.name` (and a failed job's recorded error type) says which
 * one it is after compilation and minification alike.
 */

import type { Job, Problem, Workflow } from "./types.js";

/** An error answer (4xx / 5xx) from the service, carrying its RFC 9457 problem details. */
export class JobqError extends Error {
  override name = "JobqError";
  /** The HTTP status. */
  readonly status: number;
  /** The problem+json body (`type`, `title`, `status`, `detail`, `errors`), or one made up
   * from the status line when the body was not a problem. */
  readonly problem: Problem;
  /** Seconds the service asked to wait before trying again (`Retry-After`), if it said. */
  readonly retryAfterSeconds: number | undefined;

  constructor(status: number, problem: Problem, retryAfterSeconds?: number) {
    super(describeProblem(status, problem));
    this.status = status;
    this.problem = problem;
    this.retryAfterSeconds = retryAfterSeconds;
  }

  /** The problem's `title`. */
  get title(): string {
    return this.problem.title;
  }

  /** The problem's `detail`. */
  get detail(): string {
    return this.problem.detail;
  }

  /** The problem's per-field `errors` (`[{field, message}]`); empty when it has none. */
  get errors(): Array<Record<string, unknown>> {
    return Array.isArray(this.problem.errors) ? this.problem.errors : [];
  }

  /** Whether the same request may succeed later: a 5xx, 408 or 429. */
  get transient(): boolean {
    return this.status >= 500 || this.status === 408 || this.status === 429;
  }
}

function describeProblem(status: number, problem: Problem): string {
  let text = `${status} ${problem.title || "Error"}`;
  if (problem.detail) text += `: ${problem.detail}`;
  const fields = (Array.isArray(problem.errors) ? problem.errors : []).map(
    (e) => `${String(e["field"])}: ${String(e["message"])}`,
  );
  if (fields.length > 0) text += ` [${fields.join("; ")}]`;
  return text;
}

/**
 * No usable answer came: the connection could not be made or broke, the request timed out, or
 * the body was not JSON. Worth retrying; `cause` is the underlying error.
 */
export class TransportError extends Error {
  override name = "TransportError";
  /** The underlying error's code (`ECONNRESET`, `UND_ERR_SOCKET`, `ECONNREFUSED`, ...),
   * `TIMEOUT` for a request that ran out of time, `BAD_JSON` for a body that did not parse. */
  readonly code: string;

  constructor(message: string, code: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
  }

  /**
   * Whether the connection broke (or was never opened) before any answer came: reset, closed
   * by the peer, refused. What a pooled keep-alive connection the server closed for idleness
   * gives when a request goes out on it at that moment. A timeout is not one: the service may
   * still be working on the request.
   */
  get dropped(): boolean {
    return DROPPED_CODES.has(this.code);
  }

  /** Whether the request certainly never reached the service (the connection was refused). */
  get neverSent(): boolean {
    return this.code === "ECONNREFUSED";
  }
}

const DROPPED_CODES = new Set([
  "ECONNRESET",
  "ECONNREFUSED",
  "EPIPE",
  "ECONNABORTED",
  "UND_ERR_SOCKET",
  "UND_ERR_CLOSED",
]);

/** The job did not finish within the time `Client.wait` was given; the job goes on. */
export class WaitTimeout extends Error {
  override name = "WaitTimeout";
  readonly jobId: number;
  readonly timeoutSeconds: number;
  /** The job as the service last answered it (unfinished), or `undefined` when no answer came
   * at all (every try failed with a transient error, the last of which is the `cause`). */
  readonly job: Job | undefined;

  constructor(jobId: number, timeoutSeconds: number, job: Job | undefined, cause?: unknown) {
    const state = job === undefined ? "no answer" : `still ${job.status}`;
    super(`job ${jobId} not finished after ${timeoutSeconds} s (${state})`, { cause });
    this.jobId = jobId;
    this.timeoutSeconds = timeoutSeconds;
    this.job = job;
  }
}

/** The workflow did not finish within the time `Client.waitWorkflow` was given; it goes on. */
export class WorkflowWaitTimeout extends Error {
  override name = "WorkflowWaitTimeout";
  readonly workflowId: number;
  readonly timeoutSeconds: number;
  /** The workflow as last read (`state` still `running`), or `undefined` when no answer came. */
  readonly workflow: Workflow | undefined;

  constructor(
    workflowId: number,
    timeoutSeconds: number,
    workflow: Workflow | undefined,
    cause?: unknown,
  ) {
    const state = workflow === undefined ? "no answer" : `still ${workflow.state}`;
    super(`workflow ${workflowId} not finished after ${timeoutSeconds} s (${state})`, { cause });
    this.workflowId = workflowId;
    this.timeoutSeconds = timeoutSeconds;
    this.workflow = workflow;
  }
}

/** Thrown by a handler to fail its job for good: the job goes to `dead` without retries. */
export class NonRetryableError extends Error {
  override name = "NonRetryableError";
}

/**
 * The worker no longer holds the job's lease (the lease expired and was reaped or taken over,
 * the job was cancelled, or it ran past its `timeout_seconds`): stop working on it. The reason
 * `ctx.signal` is aborted with, and what `ctx.saveCheckpoint` rejects with afterwards. The
 * worker never completes, fails or releases such a job.
 */
export class LeaseLost extends Error {
  override name = "LeaseLost";
  readonly jobId: number;
  /** The job was cancelled (by an operator or its workflow) under this lease. */
  readonly cancelled: boolean;
  /** The attempt ran past the job's `timeout_seconds`. */
  readonly timedOut: boolean;

  constructor(jobId: number, reason: { cancelled?: boolean; timedOut?: boolean } = {}) {
    const cancelled = reason.cancelled ?? false;
    const timedOut = reason.timedOut ?? false;
    const why = cancelled ? "cancelled" : timedOut ? "ran past its timeout_seconds" : "lease lost";
    super(`job ${jobId}: ${why}`);
    this.jobId = jobId;
    this.cancelled = cancelled;
    this.timedOut = timedOut;
  }
}

/**
 * The worker is stopping. `ctx.saveCheckpoint` rejects with it after saving once the worker
 * stops (let it propagate: the job is then released with that checkpoint, and the next worker
 * starts from it), and `ctx.signal` is aborted with it when the grace period is over.
 */
export class StopRequested extends Error {
  override name = "StopRequested";

  constructor(message = "the worker is stopping; the job will be released") {
    super(message);
  }
}

/** Whether `error` or an error in its `cause` chain is an instance of `kind`. */
export function causedBy(error: unknown, kind: abstract new (...args: never[]) => Error): boolean {
  const seen = new Set<unknown>();
  let e: unknown = error;
  while (e instanceof Error && !seen.has(e)) {
    if (isInstance(e, kind)) return true;
    seen.add(e);
    e = e.cause;
  }
  return false;
}

// Not a type guard: narrowing on an abstract `kind` would leave `never` in the other branch.
function isInstance(value: unknown, kind: abstract new (...args: never[]) => Error): boolean {
  return value instanceof kind;
}
