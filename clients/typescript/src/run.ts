/** What one `Worker.run()` owns, and the trigger its claim loop waits on. */

import type { Client } from "./client.js";
import type { HeldJob, LeaseKeeper } from "./leases.js";

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
  ) {}

  get stopping(): boolean {
    return this.stop.signal.aborted;
  }
}
