/**
 * The two ways a `Transport` exchanges one request for one answer: Node's own `http` (the
 * default: a keep-alive agent with a bounded pool) or a `fetch` the caller gave.
 *
 * Node's `http` costs a third of the CPU per request that Node 20's `fetch` does (no WHATWG
 * streams, `Request`, `Headers` or `AbortSignal.any` per call), which is most of a busy
 * worker's own cost. Both report failures alike: the caller's signal's reason when it aborted,
 * a `TransportError` with the socket's code when no usable answer came, `TIMEOUT` when none
 * came in time.
 */

import http from "node:http";
import https from "node:https";

import { TransportError } from "./errors.js";

/** An answer as the transport reads it. */
export interface Answer {
  status: number;
  statusText: string;
  retryAfter: string | null;
  text: string;
}

export interface Exchange {
  method: string;
  /** For messages: `POST /v1/claim`. */
  what: string;
  url: string;
  headers: Record<string, string>;
  body: string | undefined;
  timeoutSeconds: number;
  signal: AbortSignal | undefined;
}

export type Exchanger = (exchange: Exchange) => Promise<Answer>;

// An idle pooled connection is closed after this, before the service's own keep-alive timeout
// (uvicorn's 5 s) closes it under a request going out on it.
const IDLE_SOCKET_MS = 4000;

/**
 * Exchanges over Node's `http` / `https` with a keep-alive agent of its own: at most
 * `connections` sockets at once (unlimited when undefined), each kept alive while idle (up to
 * 4 s), so a busy client never opens a connection per request. Idle sockets do not hold the
 * process open.
 */
export function nodeExchanger(baseUrl: string, connections: number | undefined): Exchanger {
  const secure = new URL(baseUrl).protocol === "https:";
  const agentOptions: http.AgentOptions = {
    keepAlive: true,
    timeout: IDLE_SOCKET_MS,
    scheduling: "lifo",
    // As many kept alive as may be open: a pool that closes what it cannot keep would open a
    // connection for nearly every request.
    maxSockets: connections ?? Infinity,
    maxFreeSockets: connections ?? 256,
  };
  const agent = secure ? new https.Agent(agentOptions) : new http.Agent(agentOptions);
  const send = secure ? https.request : http.request;
  return (exchange) =>
    new Promise<Answer>((resolve, reject) => {
      const { signal } = exchange;
      if (signal?.aborted) {
        reject(signal.reason);
        return;
      }
      let done = false;
      const finish = (error: unknown, answer?: Answer): void => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        if (answer !== undefined) resolve(answer);
        else {
          request.destroy();
          reject(error);
        }
      };
      const onAbort = (): void => finish(signal?.reason);
      const headers = { ...exchange.headers };
      if (exchange.body !== undefined) {
        headers["content-length"] = String(Buffer.byteLength(exchange.body));
      }
      const request = send(exchange.url, { method: exchange.method, headers, agent }, (response) => {
        let text = "";
        response.setEncoding("utf8");
        response.on("data", (chunk: string) => {
          text += chunk;
        });
        response.on("end", () =>
          finish(undefined, {
            status: response.statusCode ?? 0,
            statusText: response.statusMessage ?? "",
            retryAfter: header(response.headers["retry-after"]),
            text,
          }),
        );
        response.on("error", (error) => finish(socketError(exchange.what, error)));
      });
      request.on("error", (error) => finish(socketError(exchange.what, error)));
      const seconds = exchange.timeoutSeconds;
      const timer = setTimeout(
        () =>
          finish(new TransportError(`${exchange.what}: no answer within ${seconds} s`, "TIMEOUT")),
        Math.ceil(seconds * 1000),
      );
      signal?.addEventListener("abort", onAbort, { once: true });
      request.end(exchange.body);
    });
}

/** Exchanges through `fetch` (the caller's own). */
export function fetchExchanger(fetcher: typeof fetch): Exchanger {
  return async (exchange) => {
    const seconds = exchange.timeoutSeconds;
    const timeout = AbortSignal.timeout(Math.ceil(seconds * 1000));
    const signal = exchange.signal ? AbortSignal.any([exchange.signal, timeout]) : timeout;
    try {
      const response = await fetcher(exchange.url, {
        method: exchange.method,
        headers: exchange.headers,
        signal,
        ...(exchange.body === undefined ? {} : { body: exchange.body }),
      });
      return {
        status: response.status,
        statusText: response.statusText,
        retryAfter: response.headers.get("retry-after"),
        text: await response.text(),
      };
    } catch (error) {
      if (exchange.signal?.aborted) throw exchange.signal.reason;
      if (timeout.aborted) {
        throw new TransportError(`${exchange.what}: no answer within ${seconds} s`, "TIMEOUT", {
          cause: error,
        });
      }
      throw fetchError(exchange.what, error);
    }
  };
}

function header(value: string | string[] | undefined): string | null {
  if (value === undefined) return null;
  return Array.isArray(value) ? (value[0] ?? null) : value;
}

/** A socket's failure (reset, refused, closed mid-answer) as a `TransportError` with its code. */
function socketError(what: string, error: Error): TransportError {
  const code = codeOf(error) ?? "UNKNOWN";
  return new TransportError(`${what}: ${error.message || code}`, code, { cause: error });
}

/** fetch's failure (a `TypeError` whose `cause` is undici's or the socket's error) as a
 * `TransportError` with the cause's code; anything else (a malformed URL, say) unchanged. */
function fetchError(what: string, error: unknown): unknown {
  if (!(error instanceof TypeError) || error.cause === undefined) return error;
  const cause = error.cause;
  const code = codeOf(cause) ?? "UNKNOWN";
  const message = cause instanceof Error ? cause.message : String(cause);
  return new TransportError(`${what}: ${message || code}`, code, { cause });
}

function codeOf(error: unknown): string | undefined {
  if (typeof error !== "object" || error === null) return undefined;
  const code = (error as { code?: unknown }).code;
  if (typeof code === "string") return code;
  // Connecting to every address of a name (IPv6 and IPv4) fails as an AggregateError.
  const errors = (error as { errors?: unknown }).errors;
  return Array.isArray(errors) ? codeOf(errors[0]) : undefined;
}
