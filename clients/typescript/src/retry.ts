/** Retrying the service's calls: which failures are worth repeating, and the pauses between
 * tries. */

import { JobqError, TransportError } from "./errors.js";

const BACKOFF_FIRST_SECONDS = 0.2;
const BACKOFF_CAP_SECONDS = 5;
/** The longest `Retry-After` honoured; a longer one is cut to this. */
const RETRY_AFTER_CAP_SECONDS = 60;

/** Whether a failed call is worth repeating: no (usable) answer, a 5xx, 408 or 429. */
export function isTransient(error: unknown): boolean {
  if (error instanceof JobqError) return error.transient;
  return error instanceof TransportError;
}

/** The error's name and message on one line, for the log. */
export function describe(error: unknown): string {
  if (error instanceof Error) return error.message ? `${error.name}: ${error.message}` : error.name;
  return String(error);
}

/** Exponential pauses between retries of a failing call, reset on success. */
export class Backoff {
  private nextSeconds = BACKOFF_FIRST_SECONDS;

  /** The pause before the next try, in seconds: twice the last up to a cap, each drawn from
   * its upper half so that many clients failing together do not retry in step. */
  next(): number {
    const delay = this.nextSeconds;
    this.nextSeconds = Math.min(this.nextSeconds * 2, BACKOFF_CAP_SECONDS);
    return delay * (0.5 + Math.random() / 2);
  }

  /** Starts over from the shortest pause. */
  reset(): void {
    this.nextSeconds = BACKOFF_FIRST_SECONDS;
  }
}

/** The pause before retrying after `error`: the `Retry-After` the service asked for (a 429 or
 * 503 says when it expects to cope again), else the backoff's next. */
export function retryDelay(error: unknown, backoff: Backoff): number {
  const asked = error instanceof JobqError ? error.retryAfterSeconds : undefined;
  return asked === undefined ? backoff.next() : Math.min(asked, RETRY_AFTER_CAP_SECONDS);
}

/** Resolves after `seconds`, or rejects with `signal.reason` as soon as the signal aborts. */
export function sleep(seconds: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(
      () => {
        signal?.removeEventListener("abort", onAbort);
        resolve();
      },
      Math.max(0, seconds * 1000),
    );
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Resolves after `seconds`, or at once when the signal aborts; never rejects. */
export async function pause(seconds: number, signal: AbortSignal): Promise<void> {
  try {
    await sleep(seconds, signal);
  } catch {
    // Aborted: the caller looks at its own state to see why.
  }
}
