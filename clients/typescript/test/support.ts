/**
 * What the tests share: the server they run against (`JOBQ_URL`, a real `jobq serve`), unique
 * queue names so that test files can share one server, polling with a deadline, and a TCP proxy
 * that breaks connections the way the keep-alive race does.
 */

import { randomBytes } from "node:crypto";
import net from "node:net";
import type { TestContext } from "node:test";

import { Client, type Logger, type Worker } from "../src/index.js";

/** The jobq server the tests run against. */
export function serverUrl(): string {
  const url = process.env["JOBQ_URL"];
  if (!url) {
    throw new Error("JOBQ_URL is not set: start `jobq serve` and point JOBQ_URL at it");
  }
  return url;
}

/** A queue no other test uses. */
export function uniqueQueue(name: string): string {
  return `ts-${name}-${randomBytes(4).toString("hex")}`;
}

/** Collects the client's log lines (and keeps the test output quiet). */
export class MemoryLogger implements Logger {
  readonly lines: string[] = [];
  debug = (message: string): void => void this.lines.push(`debug: ${message}`);
  info = (message: string): void => void this.lines.push(`info: ${message}`);
  warn = (message: string): void => void this.lines.push(`warn: ${message}`);
  error = (message: string): void => void this.lines.push(`error: ${message}`);
}

/** A client of the test server that does not log. */
export function directClient(): Client {
  return new Client({ baseUrl: serverUrl(), logger: new MemoryLogger() });
}

/**
 * Calls `probe` until it answers something other than `undefined`, and answers that; fails
 * after `timeoutSeconds` saying what it waited for. Polling, not sleeping: the test goes on the
 * moment the outcome is there.
 */
export async function eventually<T>(
  what: string,
  probe: () => Promise<T | undefined> | T | undefined,
  timeoutSeconds = 10,
): Promise<T> {
  const deadline = Date.now() + timeoutSeconds * 1000;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline)
      throw new Error(`timed out after ${timeoutSeconds} s waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

/** A promise with its resolve function, for a handler to tell the test something happened. */
export function deferred<T = void>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve: (value: T) => void = () => undefined;
  const promise = new Promise<T>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

/** Runs the worker until the test's end: answers its `run()` promise, stopping it (twice, to
 * skip the grace period) if the test did not. */
export function running(worker: Worker, t: TestContext): Promise<void> {
  const run = worker.run();
  t.after(async () => {
    worker.stop();
    worker.stop();
    await run.catch(() => undefined);
  });
  return run;
}

/**
 * A TCP proxy in front of the test server that breaks connections as the keep-alive race does.
 * It knows no more of HTTP than that a client's bytes after an answer start its next request.
 *
 * - `dropAnswers`: that many requests are passed on, and their connection is reset when the
 *   answer comes back: the server did the work, the client never hears of it;
 * - `dropReused`: that many reused connections are reset the moment their next request
 *   arrives, before the server sees it (the server's idle timeout firing as the client sends);
 * - `blackhole`: while true, every connection is reset at its next byte either way.
 */
export class DroppingProxy {
  dropAnswers = 0;
  dropReused = 0;
  blackhole = false;
  /** The first line of every request passed on (`POST /v1/claim HTTP/1.1`). */
  readonly requests: string[] = [];
  dropped = 0;
  /** Connections the proxy accepted (each a connection the client opened). */
  accepted = 0;
  private readonly server = net.createServer((socket) => this.accept(socket));
  private readonly sockets = new Set<net.Socket>();

  private constructor(private readonly upstream: URL) {}

  /** A proxy listening on a free port of 127.0.0.1. */
  static async start(upstream: string): Promise<DroppingProxy> {
    const proxy = new DroppingProxy(new URL(upstream));
    await new Promise<void>((resolve) => proxy.server.listen(0, "127.0.0.1", resolve));
    return proxy;
  }

  get url(): string {
    const address = this.server.address() as net.AddressInfo;
    return `http://127.0.0.1:${address.port}`;
  }

  /** How many requests passed on started with `prefix` (`POST /v1/claim`). */
  count(prefix: string): number {
    return this.requests.filter((line) => line.startsWith(prefix)).length;
  }

  async close(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private accept(client: net.Socket): void {
    this.accepted += 1;
    const upstream = net.connect(Number(this.upstream.port), this.upstream.hostname);
    this.sockets.add(client).add(upstream);
    let answered = false; // an answer went back: the client's next bytes reuse the connection
    let requestSent = false; // a request went upstream since the last answer
    const reset = (): void => {
      this.dropped += 1;
      client.resetAndDestroy();
      upstream.destroy();
    };
    client.on("data", (data: Buffer) => {
      if (this.blackhole) return reset();
      if (answered && !requestSent && this.dropReused > 0) {
        this.dropReused -= 1;
        return reset();
      }
      if (!requestSent) this.requests.push(data.toString("latin1").split("\r\n", 1)[0] ?? "");
      answered = false;
      requestSent = true;
      upstream.write(data);
    });
    upstream.on("data", (data: Buffer) => {
      if (this.blackhole) return reset();
      if (requestSent && !answered && this.dropAnswers > 0) {
        this.dropAnswers -= 1;
        return reset();
      }
      requestSent = false;
      answered = true;
      client.write(data);
    });
    client.on("end", () => upstream.end());
    upstream.on("end", () => client.end());
    client.on("error", () => upstream.destroy());
    upstream.on("error", () => client.destroy());
    client.on("close", () => {
      this.sockets.delete(client);
      upstream.destroy();
    });
    upstream.on("close", () => {
      this.sockets.delete(upstream);
      client.destroy();
    });
  }
}

/** One request as `RecordingFetch` saw it: `POST /v1/complete` and its JSON body. */
export interface Recorded {
  line: string;
  body: { leases?: { job_id: number }[]; claim_next?: { max_jobs: number } } | undefined;
}

/**
 * A `fetch` that passes every request on to the global one and records it with its body, so a
 * test can count a request's items; `before` runs as each request goes out (a test's hook to
 * act while it is in flight).
 */
export function recordingFetch(
  requests: Recorded[],
  before: (request: Recorded) => void = () => undefined,
): typeof fetch {
  return async (input, init) => {
    const url = new URL(String(input));
    const text = typeof init?.body === "string" ? init.body : undefined;
    const request = {
      line: `${init?.method ?? "GET"} ${url.pathname}`,
      body: text === undefined ? undefined : (JSON.parse(text) as Recorded["body"]),
    };
    requests.push(request);
    before(request);
    return fetch(input, init);
  };
}

