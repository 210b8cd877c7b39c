/**
 * `JobContext`: what a handler receives — the claimed job, its last checkpoint, an AbortSignal,
 * and the worker's stop — and the three things a worker tells it.
 *
 * A worker tells a running handler: the job is gone (`abort(new LeaseLost(...))`: lease lost,
 * cancelled, timed out), the worker is stopping (`markStopping()`), and, when the grace period
 * is over, to stop now (`abort(new StopRequested(...))`). The context never learns how its
 * checkpoint is stored: the worker hands it a `saveCheckpoint` function for that.
 */

import { StopRequested } from "./errors.js";
import type { ClaimedJob, Job, Parents } from "./types.js";

/** Stores `state` (and `progress`) under the job's lease; rejects with `LeaseLost` when the
 * lease is gone. */
export type CheckpointSaver = (state: unknown, progress: unknown) => Promise<void>;
/** Reads a job by id (the worker's `Client.getJob`). */
export type JobReader = (jobId: number) => Promise<Job>;

export interface JobContextOptions {
  /** How `saveCheckpoint` stores; without one (a handler's unit test) it only records. */
  saveCheckpoint?: CheckpointSaver;
  /** How `fetchParentResults` reads results too large to come with the claim. */
  readJob?: JobReader;
}

/**
 * What a handler receives: the claimed job, its last checkpoint and the worker's signals.
 *
 * Outside a worker (a handler's own unit tests) a context can be built from a job object
 * alone; `saveCheckpoint` then only records the state, and `markStopping` / `abort` let the
 * test play the worker's part.
 */
export class JobContext<Payload = unknown> {
  /** The job as the claim answered it. */
  readonly job: ClaimedJob;
  private readonly controller = new AbortController();
  private readonly saver: CheckpointSaver | undefined;
  private readonly reader: JobReader | undefined;
  private lastCheckpoint: unknown;
  private lastProgress: unknown;
  private isStopping = false;

  constructor(job: ClaimedJob, options: JobContextOptions = {}) {
    this.job = job;
    this.lastCheckpoint = job.checkpoint ?? null;
    this.lastProgress = job.progress ?? null;
    this.saver = options.saveCheckpoint;
    this.reader = options.readJob;
  }

  /** The job's id (stable across attempts: use it to make side effects idempotent). */
  get id(): number {
    return this.job.id;
  }

  /** The job's type, which chose the handler. */
  get type(): string {
    return this.job.type;
  }

  /** This try's number, 1 on the first (a release does not use one up). */
  get attempt(): number {
    return this.job.attempt;
  }

  /** The job's payload, as enqueued (typed as the handler declares; not checked). */
  get payload(): Payload {
    return this.job.payload as Payload;
  }

  /** The lease this worker holds the job under. */
  get leaseId(): string {
    return this.job.lease_id ?? "";
  }

  /** The last checkpoint: what the claim carried (`null` for none), then each one saved. */
  get checkpoint(): unknown {
    return this.lastCheckpoint;
  }

  /** The last progress: what the claim carried, then each one saved. */
  get progress(): unknown {
    return this.lastProgress;
  }

  /**
   * Aborted when the handler must stop at once: the lease was lost, the job was cancelled or
   * ran past its `timeout_seconds` (reason: `LeaseLost`), or the worker's grace period is over
   * (reason: `StopRequested`). Pass it to `fetch` and timers; a handler that ignores it keeps
   * its slot until it returns, but its job is never completed, failed or released by it.
   */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** Whether the job was cancelled while this handler ran (the signal is aborted too). */
  get cancelled(): boolean {
    const reason: unknown = this.controller.signal.reason;
    return (
      this.controller.signal.aborted &&
      typeof reason === "object" &&
      reason !== null &&
      (reason as { cancelled?: unknown }).cancelled === true
    );
  }

  /** Whether the worker is stopping: the next `saveCheckpoint` saves, then rejects with
   * `StopRequested`, and the job is released with that checkpoint. */
  get stopping(): boolean {
    return this.isStopping;
  }

  /** What the claim said of the jobs this one waited for (`depends_on`, a workflow's parent
   * steps, a batch's jobs for its callback); `null` for a job that waited for none. */
  get parents(): Parents | null {
    return this.job.parents ?? null;
  }

  /**
   * Each parent's result that came with the claim, keyed by its step name in a workflow, else
   * by its job id. A result too large to come inline (`result_by_reference`) is left out:
   * `fetchParentResults` reads those too. A parent whose result the worker's API key may not
   * read (`result_hidden`: its queue is outside the key's scopes) is left out of both.
   */
  get parentResults(): Record<string, unknown> {
    const results: Record<string, unknown> = {};
    for (const parent of this.parents?.jobs ?? []) {
      if (parent.result_by_reference || parent.result_hidden) continue;
      results[parent.step ?? String(parent.id)] = parent.result;
    }
    return results;
  }

  /** `parentResults` with the results too large to come inline read by job id (a parent
   * deleted meanwhile rejects with `JobqError` 404). */
  async fetchParentResults(): Promise<Record<string, unknown>> {
    const results = this.parentResults;
    for (const parent of this.parents?.jobs ?? []) {
      if (!parent.result_by_reference || parent.result_hidden) continue;
      if (this.reader === undefined) {
        throw new Error("this context has no client to read results by reference");
      }
      results[parent.step ?? String(parent.id)] = (await this.reader(parent.id)).result;
    }
    return results;
  }

  /**
   * Saves `state` (any JSON) as the job's checkpoint now, under the lease's ownership check,
   * with an optional `progress` (e.g. `{done: 8, total: 20}`). The next attempt of the job
   * (after a crash, a release or a lease expiry) receives it as `ctx.checkpoint`.
   *
   * Rejects with `LeaseLost` when the lease is no longer held (and with the signal's reason
   * once aborted), and with `StopRequested` after saving when the worker is stopping: let that
   * propagate, and the job is released with this checkpoint.
   */
  async saveCheckpoint(state: unknown, progress?: unknown): Promise<void> {
    if (this.controller.signal.aborted) throw this.controller.signal.reason;
    if (this.saver !== undefined) await this.saver(state, progress);
    this.lastCheckpoint = state;
    if (progress !== undefined) this.lastProgress = progress;
    if (this.isStopping) throw new StopRequested();
  }

  /** The worker's side: it is stopping, so the next save ends the handler. */
  markStopping(): void {
    this.isStopping = true;
  }

  /** The worker's side: the handler must stop now, for `reason` (`LeaseLost` or
   * `StopRequested`). Only the first reason counts. */
  abort(reason: Error): void {
    this.controller.abort(reason);
  }
}
