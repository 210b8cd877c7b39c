/**
 * `Worker`: claims jobs, runs their handlers and stops gracefully; a `LeaseKeeper` keeps the
 * leases.
 *
 * One worker runs up to `concurrency` handlers at once. While `run()` runs it owns:
 *
 * - the claim loop: long-polls `POST /v1/claim` for as many jobs as there are free slots;
 * - the heartbeat loop of its `LeaseKeeper`: every heartbeat interval one `POST /v1/heartbeat`
 *   for every held lease; an item answered `ok: false` (lease lost, or the job was cancelled)
 *   aborts that handler's `ctx.signal`, and the worker never completes, fails or releases that
 *   job afterwards;
 * - per job, a supervisor that awaits the handler and then has the lease keeper complete
 *   (returned), fail (threw) or release (stopped) the job. A job of a type the worker has no
 *   handler for is released for `unknownTypeDelaySeconds`, never failed. Unless stopping, that
 *   same request claims the worker's next jobs (`claim_next`, without waiting) for the slot it
 *   frees and any other free one; the claim loop long-polls only for slots nobody is claiming
 *   for already;
 * - completes are shared (`Run.completeShared`): one request at a time carries every job whose
 *   handler returned since the last one went out, and claims for all the slots that frees, so a
 *   wide worker makes one request per batch, not per job. Fails and releases go one job per
 *   request.
 *
 * Stopping (`stop()`, SIGTERM or SIGINT): claiming stops at once (the long-poll in flight is
 * aborted), every running context says `stopping`, and a handler's next `saveCheckpoint` saves
 * and then rejects with `StopRequested`, after which the job is released with that checkpoint so
 * the next worker starts at once. Handlers still running after `graceSeconds` have their signal
 * aborted and their jobs released keeping the last saved checkpoint. A second stop request ends
 * the grace period early.
 */

import { randomBytes } from "node:crypto";
import { hostname } from "node:os";

import { Client, stderrLogger, WAIT_SECONDS_MAX, type ClientOptions } from "./client.js";
import type { JobContext } from "./context.js";
import { LeaseKeeper, type HeldJob, type Outcome } from "./leases.js";
import { Backoff, describe, isTransient, pause, retryDelay } from "./retry.js";
import { Run, type Ask } from "./run.js";
import type { ClaimedJob, Logger } from "./types.js";

/** Handles one job: its return value (any JSON) completes the job, a throw fails it. The
 * payload type is the handler's own declaration, not checked against the job. */
export type Handler<Payload = any> = (ctx: JobContext<Payload>) => unknown;

const MAX_CLAIM_JOBS = 100; // the service's per-claim limit
const MAX_RELEASE_DELAY_SECONDS = 30 * 24 * 3600; // the service's limit of a release's delay
const IDLE_PAUSE_SECONDS = 0.5; // an empty claim answered faster than this is followed by a pause
// How long a job of a type this worker has no handler for goes back to the queue: long enough
// not to bounce between old workers in a rolling deploy, short enough that a new one soon runs it.
const UNKNOWN_TYPE_DELAY_SECONDS = 60;

export interface WorkerOptions extends Omit<ClientOptions, "retries" | "timeoutSeconds"> {
  /** The queues to claim from; default `["default"]`. */
  queues?: string[];
  /** How many handlers run at once; default 4. */
  concurrency?: number;
  /** The lease each claim asks for, 1 to 43200 s; default 30. */
  leaseSeconds?: number;
  /** How this worker names itself to the service; default host, pid and a random part. */
  workerId?: string;
  /** How long a stop waits for handlers to reach a checkpoint; default 30 s. */
  graceSeconds?: number;
  /** The claim's long-poll, 0 to 20 s; default 20. */
  waitSeconds?: number;
  /** How often the held leases are heartbeaten; default and at most a third of the lease, so
   * that two heartbeats can fail before it expires. */
  heartbeatIntervalSeconds?: number;
  /** How long a job of a type without a handler goes back to the queue; default 60 s. */
  unknownTypeDelaySeconds?: number;
  /** Settling a job claims the next ones in the same request; default true (false: the claim
   * loop only). */
  claimNext?: boolean;
  /** Stop on SIGTERM and SIGINT while `run()` runs; default true. */
  handleSignals?: boolean;
  /** Handlers by job type (more can be added with `handle`). */
  handlers?: Record<string, Handler>;
}

/** A worker id naming this host and process, plus a random part so two never share one. */
export function defaultWorkerId(): string {
  return `${hostname()}:${process.pid}:${randomBytes(3).toString("hex")}`;
}

/** Runs registered handlers for claimed jobs, keeping their leases alive with heartbeats. */
export class Worker {
  readonly workerId: string;
  readonly queues: readonly string[];
  readonly concurrency: number;
  readonly leaseSeconds: number;
  readonly graceSeconds: number;
  readonly waitSeconds: number;
  readonly heartbeatIntervalSeconds: number;
  readonly unknownTypeDelaySeconds: number;
  private readonly claimNext: boolean;
  private readonly handleSignals: boolean;
  private readonly clientOptions: ClientOptions;
  private readonly logger: Logger;
  private readonly handlers = new Map<string, Handler>();
  private current: Run | undefined;
  private stopBeforeRun = false;

  constructor(options: WorkerOptions = {}) {
    const queues = options.queues ?? ["default"];
    const concurrency = options.concurrency ?? 4;
    const leaseSeconds = options.leaseSeconds ?? 30;
    const graceSeconds = options.graceSeconds ?? 30;
    const waitSeconds = options.waitSeconds ?? WAIT_SECONDS_MAX;
    const heartbeat = options.heartbeatIntervalSeconds ?? leaseSeconds / 3;
    const unknownDelay = options.unknownTypeDelaySeconds ?? UNKNOWN_TYPE_DELAY_SECONDS;
    if (queues.length === 0) throw new RangeError("queues must name at least one queue");
    if (!Number.isInteger(concurrency) || concurrency < 1) {
      throw new RangeError("concurrency must be an integer >= 1");
    }
    if (!Number.isInteger(leaseSeconds) || leaseSeconds < 1 || leaseSeconds > 43200) {
      throw new RangeError("leaseSeconds must be an integer within 1..43200");
    }
    if (!(graceSeconds >= 0)) throw new RangeError("graceSeconds must be >= 0");
    if (!(waitSeconds >= 0 && waitSeconds <= WAIT_SECONDS_MAX)) {
      throw new RangeError(`waitSeconds must be within 0..${WAIT_SECONDS_MAX}`);
    }
    if (!(heartbeat > 0 && heartbeat <= leaseSeconds / 3)) {
      throw new RangeError(
        "heartbeatIntervalSeconds must be > 0 and at most leaseSeconds / 3, so that two " +
          "heartbeats can fail before the lease expires",
      );
    }
    if (!(unknownDelay >= 0 && unknownDelay <= MAX_RELEASE_DELAY_SECONDS)) {
      throw new RangeError(
        `unknownTypeDelaySeconds must be within 0..${MAX_RELEASE_DELAY_SECONDS}`,
      );
    }
    this.workerId = options.workerId ?? defaultWorkerId();
    this.queues = [...queues];
    this.concurrency = concurrency;
    this.leaseSeconds = leaseSeconds;
    this.graceSeconds = graceSeconds;
    this.waitSeconds = waitSeconds;
    this.heartbeatIntervalSeconds = heartbeat;
    this.unknownTypeDelaySeconds = unknownDelay;
    this.claimNext = options.claimNext ?? true;
    this.handleSignals = options.handleSignals ?? true;
    this.logger = options.logger ?? stderrLogger;
    this.clientOptions = {
      ...pick(options, "baseUrl", "apiKey", "fetch"),
      // Whatever the concurrency only a few requests are out at once: the claim's long-poll, a
      // heartbeat, one shared complete, and the checkpoints, fails and releases of single jobs.
      connections: options.connections ?? Math.min(concurrency, 16) + 4,
      logger: this.logger,
      // A request that takes longer than the lease is of no use to a worker.
      timeoutSeconds: Math.max(2, Math.min(30, leaseSeconds)),
      // The worker's loops retry on their own terms (the claim loop forever, heartbeats at the
      // next beat, settling for a while); the client only resends on a dropped connection.
      retries: 0,
    };
    for (const [type, handler] of Object.entries(options.handlers ?? {}))
      this.handle(type, handler);
  }

  // -- configuration -----------------------------------------------------------------------

  /** Registers the handler for jobs of `type`; answers the worker, for chaining. */
  handle<Payload = unknown>(type: string, handler: Handler<Payload>): this {
    if (typeof handler !== "function")
      throw new TypeError(`the handler for ${type} is not a function`);
    if (this.handlers.has(type)) throw new Error(`a handler for ${type} is registered already`);
    this.handlers.set(type, handler);
    return this;
  }

  /** The job types this worker has handlers for. */
  get jobTypes(): string[] {
    return [...this.handlers.keys()].sort();
  }

  /** Ids of the jobs this worker holds now. */
  get runningJobIds(): number[] {
    return this.current?.leases.jobs().map((held) => held.ref.job_id) ?? [];
  }

  // -- running -----------------------------------------------------------------------------

  /**
   * Claims and runs jobs until `stop()`, SIGTERM or SIGINT, then stops gracefully; resolves once
   * every job it held was settled or handed back.
   *
   * Transient HTTP errors are logged and retried; an error answer to the claim that will not go
   * away by retrying (a 401, 403 or 422) stops the worker, and `run()` rejects with it.
   */
  async run(): Promise<void> {
    if (this.current !== undefined) throw new Error("this worker is running already");
    const client = new Client(this.clientOptions);
    const leases = new LeaseKeeper(client, {
      workerId: this.workerId,
      leaseSeconds: this.leaseSeconds,
      heartbeatIntervalSeconds: this.heartbeatIntervalSeconds,
      logger: this.logger,
    });
    const run: Run = new Run(client, leases, {
      claimForBatch: () => this.claimNextForBatch(run),
      take: (jobs) => this.take(run, jobs),
    });
    this.current = run;
    const removeSignalHandlers = this.handleSignals
      ? this.installSignalHandlers()
      : () => undefined;
    this.logger.info(
      `worker ${this.workerId}: queues ${this.queues.join(",")}, concurrency ` +
        `${this.concurrency}, lease ${this.leaseSeconds} s, ` +
        `handlers ${this.jobTypes.join(",") || "-"}`,
    );
    try {
      // Stopped before it ran: no claim goes out at all.
      if (this.stopBeforeRun) this.beginStop(run);
      const heartbeats = leases.runHeartbeats(run.heartbeatsOver.signal).catch((error: unknown) => {
        this.logger.error(`worker ${this.workerId}: heartbeats ended: ${describe(error)}`);
      });
      let claimError: unknown;
      const claims = this.claimLoop(run).catch((error: unknown) => {
        claimError = error ?? new Error("the claim loop failed");
      });
      // Until the stop, or the claim loop gives up (a claim refused for good).
      await Promise.race([
        claims,
        new Promise<void>((resolve) => onAbort(run.stop.signal, resolve)),
      ]);
      this.beginStop(run);
      await this.drain(run);
      run.heartbeatsOver.abort();
      await Promise.all([heartbeats, claims]);
      if (claimError !== undefined) throw claimError;
    } finally {
      removeSignalHandlers();
      this.current = undefined;
      this.stopBeforeRun = false;
      this.logger.info(`worker ${this.workerId} stopped`);
    }
  }

  /** Begins a graceful stop, as SIGTERM does; a second call ends the grace period early.
   * Before `run()` it makes the next run return at once. */
  stop(): void {
    const run = this.current;
    if (run === undefined) {
      this.stopBeforeRun = true;
      return;
    }
    if (run.stopping) {
      if (!run.graceOver.signal.aborted) {
        this.logger.warn(`worker ${this.workerId}: second stop request, ending the grace period`);
        run.graceOver.abort();
      }
      return;
    }
    this.logger.info(
      `worker ${this.workerId}: stopping (holding ${run.leases.size} jobs, grace ` +
        `${this.graceSeconds} s)`,
    );
    this.beginStop(run);
  }

  /** Stops claiming now (the long-poll in flight is aborted) and tells every handler. */
  private beginStop(run: Run): void {
    run.stop.abort();
    for (const held of run.leases.jobs()) held.ctx.markStopping();
  }

  private installSignalHandlers(): () => void {
    const onSignal = (signal: NodeJS.Signals): void => {
      this.logger.info(`worker ${this.workerId}: ${signal}`);
      this.stop();
    };
    process.on("SIGTERM", onSignal);
    process.on("SIGINT", onSignal);
    return () => {
      process.off("SIGTERM", onSignal);
      process.off("SIGINT", onSignal);
    };
  }

  /** Waits up to the grace period for running jobs, then gives up on the handlers still
   * running (their signal is aborted and their jobs released) and awaits every settle call. */
  private async drain(run: Run): Promise<void> {
    const deadline = now() + this.graceSeconds;
    while (run.leases.size > 0 && !run.graceOver.signal.aborted) {
      const remaining = deadline - now();
      if (remaining <= 0) break;
      // Wakes on the first supervisor to finish, the deadline, or a second stop request.
      const wake = new AbortController();
      await Promise.race([
        ...run.supervisors,
        pause(remaining, AbortSignal.any([wake.signal, run.graceOver.signal])),
      ]);
      wake.abort(); // clears the timer, so nothing outlives the run
    }
    const left = run.leases.jobs().filter((held) => !held.ended);
    if (left.length > 0) {
      this.logger.warn(
        `worker ${this.workerId}: aborting ${left.length} handlers still running after the ` +
          "grace period; releasing their jobs",
      );
    }
    for (const held of left) held.force();
    await Promise.all(run.supervisors);
  }

  // -- claiming ----------------------------------------------------------------------------

  /** Slots neither taken by a held job nor asked for by a claim in flight. */
  private free(run: Run): number {
    return this.concurrency - (run.leases.size - run.handingOver) - run.claiming;
  }

  private async claimLoop(run: Run): Promise<void> {
    const backoff = new Backoff();
    while (!run.stopping) {
      const free = this.free(run);
      if (free <= 0) {
        await run.slotFree.wait(run.stop.signal);
        continue;
      }
      const started = now();
      let jobs: ClaimedJob[];
      try {
        jobs = await this.claim(run, Math.min(free, MAX_CLAIM_JOBS));
      } catch (error) {
        if (run.stopping) return; // the stop aborted the long-poll
        if (!isTransient(error)) {
          this.logger.error(`worker ${this.workerId}: claim refused: ${describe(error)}`);
          throw error;
        }
        const delay = retryDelay(error, backoff);
        this.logger.warn(
          `worker ${this.workerId}: claim failed (${describe(error)}); retrying in ` +
            `${delay.toFixed(1)} s`,
        );
        await pause(delay, run.stop.signal);
        continue;
      }
      backoff.reset();
      await this.take(run, jobs);
      const elapsed = now() - started;
      if (jobs.length === 0 && elapsed < IDLE_PAUSE_SECONDS) {
        // Answered empty at once (no wait asked, or the service is shutting down).
        await pause(IDLE_PAUSE_SECONDS - elapsed, run.stop.signal);
      }
    }
  }

  /** One long-polling claim, its slots reserved while it runs. */
  private async claim(run: Run, maxJobs: number): Promise<ClaimedJob[]> {
    run.claiming += maxJobs;
    try {
      return await run.client.claim(
        this.workerId,
        {
          queues: [...this.queues],
          max_jobs: maxJobs,
          lease_seconds: this.leaseSeconds,
          wait_seconds: this.waitSeconds,
        },
        { signal: run.stop.signal },
      );
    } finally {
      run.claiming -= maxJobs;
    }
  }

  /** The claim a settle call makes for the slot it frees and any other free one, reserved
   * until it is answered; `undefined` while stopping (or when the service refuses them). */
  private claimNextFor(run: Run): Ask | undefined {
    if (!this.claimNext || run.stopping || run.leases.claimNextRefused) return undefined;
    const free = Math.min(this.free(run) + 1, MAX_CLAIM_JOBS); // + 1: the settling job's slot
    if (free <= 0) return undefined;
    run.claiming += free;
    run.handingOver += 1;
    return { queues: [...this.queues], max_jobs: free, lease_seconds: this.leaseSeconds };
  }

  /** Runs claimed jobs; once stopping, hands them straight back. */
  private async take(run: Run, jobs: ClaimedJob[]): Promise<void> {
    if (jobs.length === 0) return;
    if (!run.stopping) {
      for (const job of jobs) this.start(run, job);
      return;
    }
    const leases = jobs.map((job) => ({ job_id: job.id, lease_id: job.lease_id ?? "" }));
    try {
      await run.client.release(this.workerId, leases);
    } catch (error) {
      this.logger.warn(
        `worker ${this.workerId}: handing back ${jobs.length} jobs claimed as it stopped ` +
          `failed (${describe(error)}); they return when their leases expire`,
      );
    }
  }

  private start(run: Run, job: ClaimedJob): void {
    const held = run.leases.hold(job);
    if (run.stopping) held.ctx.markStopping();
    const supervisor = this.supervise(run, held).finally(() => run.supervisors.delete(supervisor));
    run.supervisors.add(supervisor);
    this.logger.debug(
      `worker ${this.workerId}: claimed job ${job.id} (${job.type}, attempt ${job.attempt})`,
    );
  }

  // -- one job -----------------------------------------------------------------------------

  /** Runs the job's handler, then has the job settled by what became of it. Never rejects. */
  private async supervise(run: Run, held: HeldJob): Promise<void> {
    let ask: Ask | undefined;
    try {
      const handler = this.handlers.get(held.ctx.type);
      let settling: Promise<ClaimedJob[]>;
      if (handler === undefined) {
        // In a rolling deploy new types reach old workers first: hand the job back for a
        // worker that knows it instead of failing work nobody here could do.
        this.logger.warn(
          `worker ${this.workerId}: no handler for job ${held.ref.job_id} of type ` +
            `${held.ctx.type} (this worker handles: ${this.jobTypes.join(", ") || "nothing"}); ` +
            `releasing it for ${this.unknownTypeDelaySeconds} s for a worker that has one`,
        );
        held.ended = true;
        ask = this.claimNextFor(run);
        settling = run.leases.release(held, this.unknownTypeDelaySeconds, ask);
      } else {
        const outcome = await Promise.race([runHandler(handler, held.ctx), held.forced]);
        held.ended = true;
        if (outcome.kind === "returned" && run.leases.batchable(held, outcome)) {
          // Carried by a complete shared with every job that returned meanwhile.
          await run.completeShared(held, outcome.value);
          return;
        }
        ask = this.claimNextFor(run);
        settling = run.leases.settle(held, outcome, ask);
      }
      let claimed: ClaimedJob[];
      try {
        claimed = await settling;
      } finally {
        // Its claim answered: the slots it reserved are free again (its jobs start next).
        if (ask !== undefined) run.claiming -= ask.max_jobs;
      }
      await this.take(run, claimed);
    } catch (error) {
      this.logger.error(
        `worker ${this.workerId}: settling job ${held.ref.job_id} failed: ${describe(error)}`,
      );
    } finally {
      if (ask !== undefined) run.handingOver -= 1;
      run.leases.drop(held);
      run.slotFree.fire();
    }
  }

  /** The claim a shared complete makes for every free slot (its own jobs' among them: they
   * count in `handingOver`), reserved until it is answered; `undefined` while stopping. */
  private claimNextForBatch(run: Run): Ask | undefined {
    if (!this.claimNext || run.stopping || run.leases.claimNextRefused) return undefined;
    const free = Math.min(this.free(run), MAX_CLAIM_JOBS);
    if (free <= 0) return undefined;
    run.claiming += free;
    return { queues: [...this.queues], max_jobs: free, lease_seconds: this.leaseSeconds };
  }
}

/** Calls the handler; answers how it ended (never rejects, so a handler given up on at the end
 * of the grace period never becomes an unhandled rejection). */
async function runHandler(handler: Handler, ctx: JobContext): Promise<Outcome> {
  try {
    return { kind: "returned", value: await handler(ctx) };
  } catch (error) {
    return { kind: "threw", error };
  }
}

/** The options among `keys` that are set (`exactOptionalPropertyTypes` keeps unset ones out). */
function pick<T extends object, K extends keyof T>(options: T, ...keys: K[]): Partial<Pick<T, K>> {
  const picked: Partial<Pick<T, K>> = {};
  for (const key of keys) if (options[key] !== undefined) picked[key] = options[key];
  return picked;
}

function onAbort(signal: AbortSignal, listener: () => void): void {
  if (signal.aborted) listener();
  else signal.addEventListener("abort", listener, { once: true });
}

function now(): number {
  return performance.now() / 1000;
}
