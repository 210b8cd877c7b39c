/**
 * `LeaseKeeper`: the leases a worker holds, their batched heartbeats, checkpoints and settling.
 *
 * - Heartbeats: every `heartbeatIntervalSeconds` one `POST /v1/heartbeat` carries every held
 *   lease (split only past the service's per-call limit). An item answered `ok: false` (lease
 *   lost, the job cancelled or past its `timeout_seconds`) marks the job lost and aborts its
 *   handler's signal; a lost job is left out of later heartbeats and never completed, failed
 *   or released.
 * - Checkpoints: `ctx.saveCheckpoint` is one heartbeat for that lease carrying the checkpoint,
 *   so it is stored only while the lease is held.
 * - Settling: once a handler has ended, `settle` completes (returned), fails (threw) or
 *   releases (stopped) its job, retrying transient errors for a while. Only `ok` in an answer
 *   decides anything. The worker may have the call claim its next jobs too (`claimNext`): only
 *   the first try carries it (a repeat could lease jobs a second time whose first answer was
 *   lost), and an error answer to it is sent again without it, so the job is settled whatever
 *   the claim met.
 *
 * The worker owns the claim loop and the run / stop / drain lifecycle; it calls `hold` for each
 * claimed job, runs the handler, then calls `settle` and `drop`.
 */

import type { Client } from "./client.js";
import { JobContext } from "./context.js";
import { causedBy, JobqError, LeaseLost, NonRetryableError, StopRequested } from "./errors.js";
import { errorDetail } from "./failure.js";
import { Backoff, describe, isTransient, pause, retryDelay, sleep } from "./retry.js";
import type {
  ClaimedJob,
  ClaimNext,
  CompleteItem,
  FailItem,
  HeartbeatItem,
  LeaseRef,
  LeaseResult,
  Logger,
  ReleaseItem,
  SettleResults,
} from "./types.js";

export const MAX_LEASES_PER_CALL = 1000; // the service's limit of lease items per call
const SAVE_TRIES = 3; // transient failures of a checkpoint's heartbeat before the error is thrown
const SETTLE_RETRY_SECONDS = 10; // how long complete / fail / release are retried

type SettleOperation = "complete" | "fail" | "release";
type SettleItem = CompleteItem | FailItem | ReleaseItem;
/** A settle item but its lease: what the call says of the job. */
type SettleFields =
  | Omit<CompleteItem, keyof LeaseRef>
  | Omit<FailItem, keyof LeaseRef>
  | Omit<ReleaseItem, keyof LeaseRef>;

/** How a handler ended, as the worker saw it. */
export type Outcome =
  | { kind: "returned"; value: unknown }
  | { kind: "threw"; error: unknown }
  /** The grace period ended first: the worker stopped waiting for the handler. */
  | { kind: "forced" };

/** One job a worker holds: its lease, its context and what became of it. */
export class HeldJob {
  readonly ref: LeaseRef;
  readonly ctx: JobContext;
  /** The service said the lease is gone: never settle this job. */
  lost = false;
  /** The handler has ended (or was given up on): its settle call is under way. */
  ended = false;
  /** A checkpoint was saved under this lease: a release after a stop hands it on. */
  savedCheckpoint = false;
  /** Resolves when the worker gives up waiting for the handler (the grace period ended). */
  readonly forced: Promise<Outcome>;
  private resolveForced: (outcome: Outcome) => void = () => undefined;
  private wasForced = false;

  constructor(job: ClaimedJob, keeper: LeaseKeeper, readJob: Client["getJob"]) {
    this.ref = { job_id: job.id, lease_id: job.lease_id ?? "" };
    this.ctx = new JobContext(job, {
      saveCheckpoint: (state, progress) => keeper.saveCheckpoint(this, state, progress),
      readJob: (jobId) => readJob(jobId),
    });
    this.forced = new Promise((resolve) => {
      this.resolveForced = resolve;
    });
  }

  /** The job and lease ids: a job claimed again after a loss is a different lease. */
  get key(): string {
    return `${this.ref.job_id}:${this.ref.lease_id}`;
  }

  /** Whether the worker stopped waiting for the handler. */
  get isForced(): boolean {
    return this.wasForced;
  }

  /** The grace period is over: aborts the handler and stops waiting for it. */
  force(): void {
    this.wasForced = true;
    this.ctx.abort(new StopRequested("the worker's grace period is over"));
    this.resolveForced({ kind: "forced" });
  }
}

export interface LeaseKeeperOptions {
  workerId: string;
  leaseSeconds: number;
  heartbeatIntervalSeconds: number;
  logger: Logger;
}

/** Keeps a worker's leases: heartbeats them in batches, saves checkpoints and settles jobs. */
export class LeaseKeeper {
  /** The service refused a `claim_next` (one from before it, say): settle without from now. */
  claimNextRefused = false;
  private readonly held = new Map<string, HeldJob>();
  private readonly workerId: string;
  private readonly leaseSeconds: number;
  private readonly interval: number;
  private readonly logger: Logger;

  constructor(
    private readonly client: Client,
    options: LeaseKeeperOptions,
  ) {
    this.workerId = options.workerId;
    this.leaseSeconds = options.leaseSeconds;
    this.interval = options.heartbeatIntervalSeconds;
    this.logger = options.logger;
  }

  /** How many jobs are held. */
  get size(): number {
    return this.held.size;
  }

  /** The jobs held now, as an array that stays valid while jobs come and go. */
  jobs(): HeldJob[] {
    return [...this.held.values()];
  }

  /** Starts keeping the lease of a just claimed job; answers its record. */
  hold(job: ClaimedJob): HeldJob {
    const held = new HeldJob(job, this, (jobId) => this.client.getJob(jobId));
    this.held.set(held.key, held);
    return held;
  }

  /** Stops keeping the job's lease: it was settled, given up or handed back. */
  drop(held: HeldJob): void {
    if (this.held.get(held.key) === held) this.held.delete(held.key);
  }

  // -- heartbeats --------------------------------------------------------------------------

  /** Every heartbeat interval, one heartbeat request carrying every lease still held, until
   * `stop` aborts. */
  async runHeartbeats(stop: AbortSignal): Promise<void> {
    let delay = this.interval;
    for (;;) {
      await pause(delay, stop);
      if (stop.aborted) return;
      const started = now();
      const held = this.jobs().filter((h) => !h.lost);
      let answered = true;
      for (let first = 0; first < held.length; first += MAX_LEASES_PER_CALL) {
        const batch = held.slice(first, first + MAX_LEASES_PER_CALL);
        answered = (await this.heartbeat(batch, stop)) && answered;
      }
      // Keep the cadence whatever the request took; after a failure, try again sooner.
      const interval = answered ? this.interval : Math.min(this.interval, 1);
      delay = Math.max(0, interval - (now() - started));
    }
  }

  /** One heartbeat request for these leases; answers whether the service answered it. */
  private async heartbeat(held: HeldJob[], stop: AbortSignal): Promise<boolean> {
    const items = held.map((h) => ({ ...h.ref, lease_seconds: this.leaseSeconds }));
    let results: LeaseResult[];
    try {
      results = await this.client.heartbeat(this.workerId, items, { signal: stop });
    } catch (error) {
      if (stop.aborted) return true;
      if (!isTransient(error)) {
        this.logger.error(`worker ${this.workerId}: heartbeat refused: ${describe(error)}`);
        return true;
      }
      this.logger.warn(
        `worker ${this.workerId}: heartbeat of ${items.length} leases failed ` +
          `(${describe(error)}); retrying soon`,
      );
      return false;
    }
    held.forEach((h, i) => {
      const result = results[i];
      if (result !== undefined && result.job_id === h.ref.job_id && !result.ok) {
        this.lose(h, result);
      }
    });
    return true;
  }

  /** The service says the lease is gone: abort the handler, and never settle the job. */
  private lose(held: HeldJob, result: LeaseResult): void {
    if (held.lost || this.held.get(held.key) !== held) return;
    // Already completing / failing / releasing: that call gets the verdict itself.
    if (held.ended) return;
    held.lost = true;
    this.logger.warn(
      `worker ${this.workerId}: job ${held.ref.job_id} ${lossReason(result)}; aborting its handler`,
    );
    held.ctx.abort(lostError(held, result));
  }

  // -- checkpoints -------------------------------------------------------------------------

  /** `ctx.saveCheckpoint`'s saver: one heartbeat for this lease carrying the checkpoint. */
  async saveCheckpoint(held: HeldJob, state: unknown, progress: unknown): Promise<void> {
    if (state === undefined) throw new TypeError("a checkpoint must be JSON (undefined is not)");
    if (held.lost) throw new LeaseLost(held.ref.job_id);
    const item: HeartbeatItem = {
      ...held.ref,
      lease_seconds: this.leaseSeconds,
      checkpoint: state,
    };
    if (progress !== undefined) item.progress = progress;
    // The handler's signal ends the save too: once aborted, the handler must stop at once.
    const signal = held.ctx.signal;
    const backoff = new Backoff();
    let result: LeaseResult | undefined;
    for (let attempt = 1; ; attempt += 1) {
      try {
        [result] = await this.client.heartbeat(this.workerId, [item], { signal });
        break;
      } catch (error) {
        if (signal.aborted || !isTransient(error) || attempt === SAVE_TRIES) throw error;
        this.logger.warn(
          `worker ${this.workerId}: saving job ${held.ref.job_id}'s checkpoint failed ` +
            `(${describe(error)}); retrying`,
        );
        await sleep(backoff.next(), signal);
      }
    }
    if (result === undefined || !result.ok) {
      const lost = lostError(held, result);
      held.lost = true;
      this.logger.warn(
        `worker ${this.workerId}: job ${held.ref.job_id} ${lossReason(result)} ` +
          "while saving its checkpoint",
      );
      held.ctx.abort(lost);
      throw lost;
    }
    held.savedCheckpoint = true;
  }

  // -- settling ----------------------------------------------------------------------------

  /**
   * Completes, fails or releases the job according to how its handler ended. `claimNext` has
   * the same request claim the worker's next jobs; answers them (none when the job was given
   * up or the claim took nothing).
   */
  async settle(held: HeldJob, outcome: Outcome, claimNext?: ClaimNext): Promise<ClaimedJob[]> {
    const jobId = held.ref.job_id;
    if (held.lost) {
      this.logger.info(`worker ${this.workerId}: job ${jobId} given up (not held any more)`);
      return [];
    }
    if (outcome.kind === "forced" || held.isForced) {
      // The grace period ended: the service keeps the last saved checkpoint.
      return this.send(held, "release", {}, claimNext);
    }
    if (outcome.kind === "returned") return this.complete(held, outcome.value, claimNext);
    const error = outcome.error;
    if (causedBy(error, LeaseLost)) {
      held.lost = true;
      return [];
    }
    if (causedBy(error, StopRequested)) {
      // Saved already, under the lease; sent again so the release says what it hands on.
      const fields = held.savedCheckpoint ? { checkpoint: held.ctx.checkpoint } : {};
      return this.send(held, "release", fields, claimNext);
    }
    this.logger.warn(`worker ${this.workerId}: job ${jobId} failed: ${describe(error)}`);
    return this.send(
      held,
      "fail",
      { error: errorDetail(error), retryable: !causedBy(error, NonRetryableError) },
      claimNext,
    );
  }

  /** Whether the job may be completed in a request shared with other jobs: its handler
   * returned a JSON result while its lease was held (anything else is settled on its own). */
  batchable(held: HeldJob, outcome: Outcome): boolean {
    if (held.lost || held.isForced || outcome.kind !== "returned") return false;
    try {
      return JSON.stringify(outcome.value === undefined ? null : outcome.value) !== undefined;
    } catch {
      return false; // `complete` fails it, saying why
    }
  }

  /**
   * Completes several jobs, each with its handler's result, in one request; retried as one
   * job's settle is (`claimNext` only on the first try). Each item's `ok` is its own: a job
   * whose lease was lost meanwhile is refused by the service and only logged. When the
   * service refuses the request for good (one result too large, say), each job is completed
   * on its own, so only the job it refuses is failed. Answers the jobs `claimNext` claimed.
   */
  async completeMany(
    done: readonly { held: HeldJob; value: unknown }[],
    claimNext?: ClaimNext,
  ): Promise<ClaimedJob[]> {
    const items: CompleteItem[] = done.map(({ held, value }) => ({
      ...held.ref,
      result: value === undefined ? null : value,
    }));
    const deadline = now() + SETTLE_RETRY_SECONDS;
    const backoff = new Backoff();
    let ask = claimNext;
    let answer: SettleResults;
    for (;;) {
      const claiming = ask;
      ask = undefined;
      try {
        const options = claiming === undefined ? {} : { claimNext: claiming };
        answer = await this.client.complete(this.workerId, items, options);
        break;
      } catch (error) {
        if (claiming !== undefined && error instanceof JobqError && !error.transient) {
          this.refuseClaimNext(error);
          continue;
        }
        if (isTransient(error) && now() < deadline) {
          this.logger.warn(
            `worker ${this.workerId}: complete of ${items.length} jobs failed ` +
              `(${describe(error)}); retrying`,
          );
          await sleep(retryDelay(error, backoff));
          continue;
        }
        if (error instanceof JobqError && !error.transient) {
          // Each on its own: the one the service will not take is failed, saying why.
          for (const { held, value } of done) await this.complete(held, value, undefined);
          return [];
        }
        throw error;
      }
    }
    done.forEach(({ held }, i) => this.settled(held, "complete", answer.results[i]));
    this.claimFailed(answer, `completing ${items.length} jobs`);
    return answer.claimed?.jobs ?? [];
  }

  /** Hands the job back without charging the attempt, claimable again after `delaySeconds`. */
  async release(held: HeldJob, delaySeconds: number, claimNext?: ClaimNext): Promise<ClaimedJob[]> {
    return this.send(held, "release", { delay_seconds: delaySeconds }, claimNext);
  }

  private async complete(
    held: HeldJob,
    value: unknown,
    claimNext: ClaimNext | undefined,
  ): Promise<ClaimedJob[]> {
    const result = value === undefined ? null : value;
    let problem: string | undefined;
    try {
      if (JSON.stringify(result) === undefined) problem = `a ${typeof result} is not JSON`;
    } catch (error) {
      problem = describe(error);
    }
    if (problem !== undefined) {
      const text = `the handler's result is not JSON: ${problem}`;
      return this.send(held, "fail", { error: text, retryable: false }, claimNext);
    }
    return this.send(held, "complete", { result }, claimNext);
  }

  /** Completes, fails or releases one job, retrying transient errors for a while; answers the
   * jobs its `claimNext` claimed. */
  private async send(
    held: HeldJob,
    operation: SettleOperation,
    fields: SettleFields,
    claimNext: ClaimNext | undefined,
  ): Promise<ClaimedJob[]> {
    const deadline = now() + SETTLE_RETRY_SECONDS;
    const backoff = new Backoff();
    let item: SettleItem = { ...held.ref, ...fields };
    let ask = claimNext;
    let answer: SettleResults;
    for (;;) {
      // Only the first try claims: the claim loop covers the slot once the job is settled.
      const claiming = ask;
      ask = undefined;
      try {
        const options = claiming === undefined ? {} : { claimNext: claiming };
        answer = await this.post(operation, item, options);
        break;
      } catch (error) {
        if (claiming !== undefined && error instanceof JobqError && !error.transient) {
          this.refuseClaimNext(error);
          continue; // the settle on its own, whatever the claim was refused for
        }
        if (isTransient(error) && now() < deadline) {
          this.logger.warn(
            `worker ${this.workerId}: ${operation} of job ${held.ref.job_id} failed ` +
              `(${describe(error)}); retrying`,
          );
          await sleep(retryDelay(error, backoff));
          continue;
        }
        if (operation === "complete" && error instanceof JobqError && !error.transient) {
          // The service will not take this result (too large, say): fail for good.
          operation = "fail";
          item = { ...held.ref, error: `complete refused: ${error.message}`, retryable: false };
          continue;
        }
        throw error;
      }
    }
    this.settled(held, operation, answer.results[0]);
    this.claimFailed(answer, `${operation} of job ${held.ref.job_id}`);
    return answer.claimed?.jobs ?? [];
  }

  /** Logs what the service said of one settled job: only its own `ok` counts. */
  private settled(
    held: HeldJob,
    operation: SettleOperation,
    result: LeaseResult | undefined,
  ): void {
    if (result?.ok && result.job_id === held.ref.job_id) {
      this.logger.debug(
        `worker ${this.workerId}: job ${held.ref.job_id} ${operation} -> ${String(result.status)}`,
      );
    } else {
      this.logger.warn(
        `worker ${this.workerId}: ${operation} of job ${held.ref.job_id} refused: ` +
          lossReason(result),
      );
    }
  }

  private claimFailed(answer: SettleResults, after: string): void {
    if (answer.claim_error) {
      this.logger.warn(
        `worker ${this.workerId}: the claim after ${after} failed: ` +
          `${answer.claim_error.status} ${answer.claim_error.detail}`,
      );
    }
  }

  private post(
    operation: SettleOperation,
    item: SettleItem,
    options: { claimNext?: ClaimNext },
  ): Promise<SettleResults> {
    switch (operation) {
      case "complete":
        return this.client.complete(this.workerId, [item], options);
      case "fail":
        return this.client.fail(this.workerId, [item], options);
      case "release":
        return this.client.release(this.workerId, [item], options);
    }
  }

  /** A settle carrying `claim_next` was refused: it goes again without. A service that names
   * the field does not take it (or not from this worker): none is sent any more. */
  private refuseClaimNext(error: JobqError): void {
    const named = error.errors.some((e) => String(e["field"]).startsWith("body.claim_next"));
    if (named && !this.claimNextRefused) {
      this.logger.warn(
        `worker ${this.workerId}: the service refuses claim_next (${error.message}); ` +
          "claiming on its own",
      );
      this.claimNextRefused = true;
    }
  }
}

function lostError(held: HeldJob, result: LeaseResult | undefined): LeaseLost {
  return new LeaseLost(held.ref.job_id, {
    cancelled: result?.cancelled ?? false,
    timedOut: result?.timed_out ?? false,
  });
}

/** Why a lease item was answered `ok: false`, for the log. */
function lossReason(result: LeaseResult | undefined): string {
  if (result?.cancelled) return "was cancelled";
  if (result?.timed_out) return "ran past its timeout_seconds";
  return "lease lost";
}

function now(): number {
  return performance.now() / 1000;
}
