/**
 * The wire types of the jobq API, named: aliases of the schemas openapi-typescript generated
 * from the service's openapi.json into `schema.ts` (regenerate with `npm run generate`).
 *
 * Field names are the service's own (snake_case), in requests and answers alike, so a job reads
 * the same here as in the API reference and the service's logs.
 */

import type { components } from "./schema.js";

type Schemas = components["schemas"];

/** A job as the service answers it. */
export type Job = Schemas["Job"];
/** A job as a claim answers it: a `Job` plus its `attempt` and what its parents ended as. */
export type ClaimedJob = Schemas["ClaimedJob"];
/** A job's stored state. */
export type JobStatus = Schemas["JobStatus"];
/** One job to enqueue: `type` and, optionally, every other field of `POST /v1/jobs`. */
export type EnqueueRequest = Schemas["EnqueueRequest"];
/** The jobs of a batch in the order sent, with the batch's callback job when it named one. */
export type JobBatch = Schemas["JobBatch"];
/** A batch's lean answer: the ids in order, whether each was created, the callback's id. */
export type BatchIds = Schemas["BatchIds"];
/** The job a batch adds to run once all of it succeeded (`when: "all_succeeded"`) or ended. */
export type BatchCallback = Schemas["BatchCallback"];
/** One page of jobs, newest first. */
export type JobPage = Schemas["JobPage"];
/** One page of a job's history, oldest first. */
export type JobEventPage = Schemas["JobEventPage"];
/** What a job that waited for others learns of them when claimed. */
export type Parents = Schemas["Parents"];
/** A workflow to create: named steps, each a job template with the steps it runs `after`. */
export type CreateWorkflow = Schemas["CreateWorkflow"];
/** One step of a workflow to create. */
export type WorkflowStep = Schemas["Step"];
/** A workflow with each step's job as it is now. */
export type Workflow = Schemas["Workflow"];
/** What a cancel or retry of a whole workflow moved. */
export type WorkflowChange = Schemas["WorkflowChange"];
/** An RFC 9457 problem, as every error answer's body carries it. */
export type Problem = Schemas["Problem"];
/** A failure's error as the worker's language knows it: type name, message, stack. */
export type ErrorDetail = Schemas["ErrorDetail"];

/** What `POST /v1/claim` takes besides the worker id. */
export type ClaimOptions = Schemas["ClaimNext"];
/** The claim a complete, fail or release makes in the same request (`claim_next`). */
export type ClaimNext = Schemas["ClaimNext"];
/** One lease to extend, optionally saving a checkpoint and progress. */
export type HeartbeatItem = Schemas["HeartbeatItem"];
/** One held job to complete, with its result. */
export type CompleteItem = Schemas["CompleteItem"];
/** One held job's attempt to fail. */
export type FailItem = Schemas["FailItem"];
/** One held job to hand back without charging the attempt. */
export type ReleaseItem = Schemas["ReleaseItem"];
/** The verdict for one lease: held and done (`ok`), or lost. */
export type LeaseResult = Schemas["LeaseResult"];
/** One verdict per lease, in request order; with `claim_next`, the jobs it claimed. */
export type SettleResults = Schemas["SettleResults"];

/** A lease: the job and the lease the worker holds it under. */
export interface LeaseRef {
  job_id: number;
  lease_id: string;
}

/** Options every call takes. */
export interface CallOptions {
  /** Aborts the call (and its retries); the call rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** Where the client writes what it does; `console` fits, as does any structured logger. */
export interface Logger {
  debug(message: string): void;
  info(message: string): void;
  warn(message: string): void;
  error(message: string): void;
}
