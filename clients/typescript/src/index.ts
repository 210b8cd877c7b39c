/**
 * The TypeScript client of jobq, an HTTP job queue on PostgreSQL.
 *
 * `Client` enqueues and reads jobs (alone, in batches, or as workflows), awaits their results
 * and speaks the raw worker protocol; `Worker` runs handlers for claimed jobs with batched
 * heartbeats, checkpoints and a graceful stop.
 *
 * Inside: `client` (the calls), `transport` (timeouts, safe retries), `http` (Node's `http` with
 * a keep-alive pool, or a `fetch` given), `worker` (claim loop, shared completes, run / stop /
 * drain; its state in `run`), `leases` (heartbeats, checkpoint saves, complete / fail /
 * release), `failure` (a handler's error as the service records it), `context` (`JobContext`),
 * `retry`, `errors`, `types` (named wire types generated from the service's openapi.json into
 * `schema`).
 */

export {
  Client,
  DEFAULT_BASE_URL,
  newIdempotencyKey,
  stderrLogger,
  WAIT_SECONDS_MAX,
  type ClientOptions,
  type ListJobsOptions,
  type SettleOptions,
  type WaitOptions,
} from "./client.js";
export {
  JobContext,
  type CheckpointSaver,
  type JobContextOptions,
  type JobReader,
} from "./context.js";
export {
  JobqError,
  LeaseLost,
  NonRetryableError,
  StopRequested,
  TransportError,
  WaitTimeout,
  WorkflowWaitTimeout,
} from "./errors.js";
export { errorDetail } from "./failure.js";
export { defaultWorkerId, Worker, type Handler, type WorkerOptions } from "./worker.js";
export type * from "./types.js";
export type { components, paths, operations } from "./schema.js";
