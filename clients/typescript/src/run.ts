/** What one `Worker.run()` owns: its stop, its counts of slots, the trigger its claim loop waits
 * on, and the shared completes. */

import type { Client } from "./client.js";
import { MAX_LEASES_PER_CALL, type HeldJob, type LeaseKeeper } from "./leases.js";
import type { ClaimedJob, ClaimNext } from "./types.js";

/** A `claim_next` as the worker sends it: `max_jobs` always set, as its slots are reserved. */
export type Ask = ClaimNext & { max_jobs: number };

/** What a run asks of its worker. */
export interface RunHooks {
  /** The claim a shared complete makes for the free slots, reserved in `claiming`. */
  claimForBatch(): Ask | undefined;
  /** Starts claimed jobs (or hands them back while stopping). */
  take(jobs: ClaimedJob[]): Promise<void>;
}

/** A job waiting for a shared complete; settled once a request carried it (or gave up). */
export interface PendingComplete {
  held: HeldJob;
  value: unknown;
  resolve: () => void;
  reject: (error: unknown) => void;
}

/** Wakes everyone waiting, each time it fires; a wait also ends when its signal aborts. */
export class Trigger {
  private readonly waiters = new Set<() => void>();

  fire(): void {
    const waiting = [...this.waiters];
    this.waiters.clear();
    for (const wake of waiting) wake();
  }

  wait(signal: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      if (signal.aborted) {
        resolve();
        return;
      }
      const wake = (): void => {
        signal.removeEventListener("abort", wake);
        this.waiters.delete(wake);
        resolve();
      };
      this.waiters.add(wake);
      signal.addEventListener("abort", wake, { once: true });
    });
  }
}

/** What one `run()` owns; a new one for each run. */
export class Run {
  /** Aborted when the stop begins: ends claiming (the long-poll in flight too). */
  readonly stop = new AbortController();
  /** Aborted by a second stop request: ends the grace period. */
  readonly graceOver = new AbortController();
  /** Aborted once every job is settled: ends the heartbeats. */
  readonly heartbeatsOver = new AbortController();
  readonly slotFree = new Trigger();
  readonly supervisors = new Set<Promise<void>>();
  /** Slots asked for by claims in flight: the claim loop's, and those riding on settle calls. */
  claiming = 0;
  /** Held jobs whose settle call claims for their slot (so counted in `claiming` instead), and
   * those in a shared complete under way (their handlers have ended). */
  handingOver = 0;
  /** Jobs whose handler returned, waiting for the next shared complete. */
  readonly toComplete: PendingComplete[] = [];
  /** A shared complete is under way (or about to go out). */
  flushing = false;

  constructor(
    readonly client: Client,
    readonly leases: LeaseKeeper,
    private readonly hooks: RunHooks,
  ) {}

  get stopping(): boolean {
    return this.stop.signal.aborted;
  }

  /** Queues the job's complete; resolves once a shared complete carried it (rejects when that
   * request failed for good). */
  completeShared(held: HeldJob, value: unknown): Promise<void> {
    return new Promise((resolve, reject) => {
      this.toComplete.push({ held, value, resolve, reject });
      if (this.flushing) return;
      this.flushing = true;
      // After this turn, so every handler that returned in it joins the first request.
      setImmediate(() => void this.flushCompletes());
    });
  }

  /**
   * Sends the queued completes, one request at a time, each carrying every job that returned
   * while the one before was in flight, and claiming for the slots they free and any other free
   * one. One at a time: while one is out the next batch grows, so a busy worker makes few
   * requests however wide it is. A job whose lease was lost meanwhile is left out.
   */
  private async flushCompletes(): Promise<void> {
    try {
      while (this.toComplete.length > 0) {
        const queued = this.toComplete.splice(0, MAX_LEASES_PER_CALL);
        const batch = queued.filter((pending) => !pending.held.lost);
        for (const pending of queued) if (pending.held.lost) pending.resolve();
        if (batch.length === 0) continue;
        this.handingOver += batch.length;
        const ask = this.hooks.claimForBatch();
        let claimed: ClaimedJob[] = [];
        let failure: { error: unknown } | undefined;
        try {
          claimed = await this.leases.completeMany(batch, ask);
        } catch (error) {
          failure = { error };
        } finally {
          if (ask !== undefined) this.claiming -= ask.max_jobs;
          this.handingOver -= batch.length;
          for (const { held } of batch) this.leases.drop(held);
        }
        try {
          // Started before the supervisors wake, so their slots are taken at once.
          await this.hooks.take(claimed);
        } finally {
          for (const pending of batch) {
            if (failure === undefined) pending.resolve();
            else pending.reject(failure.error);
          }
        }
      }
    } finally {
      this.flushing = false;
      // Only after an unexpected error: nobody is left to send these.
      for (const pending of this.toComplete.splice(0)) pending.reject(new Error("not completed"));
    }
  }
}
