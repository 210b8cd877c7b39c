#!/usr/bin/env node
/**
 * The TypeScript client's driver for the clients' contract suite (clients/CONTRACT.md): a small
 * program on the client's public API alone, which the suite starts, signals, kills and reads.
 *
 *     node dist/contract/driver.js enqueue '<json>'
 *     node dist/contract/driver.js workflow '<json>'
 *     node dist/contract/driver.js wait <job_id> <timeout_seconds>
 *     node dist/contract/driver.js worker
 *
 * Every command prints JSON objects, one a line, on stdout (a pipe or a file: written at once);
 * diagnostics go to stderr. Settings come from the environment, as CONTRACT.md lists them.
 */

import {
  Client,
  JobqError,
  WaitTimeout,
  Worker,
  type Handler,
  type JobContext,
  type Logger,
  type WorkerOptions,
} from "../index.js";

function emit(line: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify(line)}\n`);
}

const stderr: Logger = {
  debug: () => undefined,
  info: (message) => process.stderr.write(`info: ${message}\n`),
  warn: (message) => process.stderr.write(`warning: ${message}\n`),
  error: (message) => process.stderr.write(`error: ${message}\n`),
};

function required(name: string): string {
  const value = process.env[name];
  if (value === undefined || value === "") throw new Error(`${name} is not set`);
  return value;
}

function number(name: string): number | undefined {
  const value = process.env[name];
  if (value === undefined || value === "") return undefined;
  const parsed = Number(value);
  if (!Number.isFinite(parsed)) throw new Error(`${name} is not a number: ${value}`);
  return parsed;
}

function connection(): { baseUrl: string; apiKey?: string } {
  const apiKey = process.env["JOBQ_API_KEY"];
  return { baseUrl: required("JOBQ_URL"), ...(apiKey ? { apiKey } : {}) };
}

// -- producer commands -----------------------------------------------------------------------

async function enqueue(spec: string): Promise<void> {
  const job = JSON.parse(spec) as { type: string; payload?: unknown; idempotency_key?: string };
  const client = new Client({ ...connection(), logger: stderr });
  try {
    emit({ ok: true, job: await client.enqueue({ ...job, queue: required("JOBQ_QUEUE") }) });
  } catch (error) {
    if (!(error instanceof JobqError)) throw error;
    emit({ ok: false, status: error.status, problem: error.problem });
  }
}

async function workflow(spec: string): Promise<void> {
  const flow = JSON.parse(spec) as {
    name: string;
    idempotency_key?: string;
    steps: { name: string; type: string; payload?: unknown; after?: string[] }[];
  };
  const queue = required("JOBQ_QUEUE");
  const client = new Client({ ...connection(), logger: stderr });
  try {
    const created = await client.createWorkflow({
      ...flow,
      steps: flow.steps.map((step) => ({ ...step, queue })),
    });
    emit({ ok: true, workflow: created });
  } catch (error) {
    if (!(error instanceof JobqError)) throw error;
    emit({ ok: false, status: error.status, problem: error.problem });
  }
}

async function wait(jobId: string, timeout: string): Promise<void> {
  const client = new Client({ ...connection(), logger: stderr });
  try {
    emit({ ok: true, job: await client.wait(Number(jobId), { timeoutSeconds: Number(timeout) }) });
  } catch (error) {
    if (!(error instanceof WaitTimeout)) throw error;
    emit({ ok: false, timeout: true });
  }
}

// -- the worker and its handlers -------------------------------------------------------------

/** The error `boom` fails with: the service records its type, message and stack. */
class ContractBoom extends Error {
  override name = "ContractBoom";
}

async function echo(ctx: JobContext): Promise<unknown> {
  return { echo: ctx.payload };
}

async function noop(): Promise<null> {
  return null;
}

async function sleep1ms(): Promise<null> {
  await new Promise((resolve) => setTimeout(resolve, 1));
  return null;
}

// Named `boom`, so the stack the service records names the handler function.
async function boom(ctx: JobContext<{ message: string }>): Promise<never> {
  throw new ContractBoom(ctx.payload.message);
}

async function chunked(
  ctx: JobContext<{ chunks: number; chunk_seconds: number }>,
): Promise<unknown> {
  const { chunks, chunk_seconds: seconds } = ctx.payload;
  const start = (ctx.checkpoint as { next?: number } | null)?.next ?? 0;
  for (let n = start; n < chunks; n += 1) {
    await abortableSleep(ctx, seconds);
    // While the worker stops this saves, then rejects with StopRequested: the job is released.
    await ctx.saveCheckpoint({ next: n + 1 }, { done: n + 1, total: chunks });
  }
  return { chunks, resumed_from: start };
}

async function hang(ctx: JobContext): Promise<never> {
  await new Promise<void>((resolve) => {
    if (ctx.signal.aborted) resolve();
    else ctx.signal.addEventListener("abort", () => resolve(), { once: true });
  });
  emit({ event: "aborted", job_id: ctx.id });
  throw ctx.signal.reason;
}

/** Sleeps `seconds`, or ends at the job's abort: prints `aborted` and rejects with its reason. */
function abortableSleep(ctx: JobContext, seconds: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const onAbort = (): void => {
      clearTimeout(timer);
      emit({ event: "aborted", job_id: ctx.id });
      reject(ctx.signal.reason);
    };
    const timer = setTimeout(() => {
      ctx.signal.removeEventListener("abort", onAbort);
      resolve();
    }, seconds * 1000);
    if (ctx.signal.aborted) onAbort();
    else ctx.signal.addEventListener("abort", onAbort, { once: true });
  });
}

/** The handler, printing `started` first. */
function announced(handler: Handler): Handler {
  return (ctx: JobContext) => {
    emit({
      event: "started",
      job_id: ctx.id,
      type: ctx.type,
      attempt: ctx.attempt,
      checkpoint: ctx.checkpoint ?? null,
    });
    return handler(ctx);
  };
}

async function work(): Promise<void> {
  const options: WorkerOptions = {
    ...connection(),
    queues: [required("JOBQ_QUEUE")],
    workerId: required("JOBQ_WORKER_ID"),
    concurrency: number("JOBQ_CONCURRENCY") ?? 1,
    leaseSeconds: number("JOBQ_LEASE_SECONDS") ?? 30,
    graceSeconds: number("JOBQ_GRACE_SECONDS") ?? 10,
    waitSeconds: number("JOBQ_WAIT_SECONDS") ?? 2,
    logger: stderr,
    handlers: { echo, noop, sleep1ms, boom, chunked, hang },
  };
  const heartbeat = number("JOBQ_HEARTBEAT_SECONDS"); // default: a third of the lease
  if (heartbeat !== undefined) options.heartbeatIntervalSeconds = heartbeat;
  options.handlers = Object.fromEntries(
    Object.entries(options.handlers ?? {}).map(([type, handler]) => [type, announced(handler)]),
  );
  const worker = new Worker(options);
  const running = worker.run();
  // Printed before the first claim can return: run() has only sent it so far.
  emit({ event: "ready" });
  await running;
  emit({ event: "stopped" });
}

async function main(argv: string[]): Promise<void> {
  const [command, ...args] = argv;
  if (command === "enqueue" && args.length === 1) return enqueue(args[0] ?? "");
  if (command === "workflow" && args.length === 1) return workflow(args[0] ?? "");
  if (command === "wait" && args.length === 2) return wait(args[0] ?? "", args[1] ?? "");
  if (command === "worker" && args.length === 0) return work();
  throw new Error(
    "usage: driver.js enqueue <json> | workflow <json> | wait <job_id> <timeout_seconds> | worker",
  );
}

main(process.argv.slice(2)).then(
  // Exits at once: an idle pooled connection must not hold the process open.
  () => process.exit(0),
  (error: unknown) => {
    process.stderr.write(
      `driver: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`,
    );
    process.exit(1);
  },
);
