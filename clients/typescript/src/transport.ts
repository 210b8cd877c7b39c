/**
 * One HTTP call to the service (over Node's `http`, or a `fetch` given: see `http`): JSON in
 * and out, a timeout, error answers as `JobqError`, failures to get an answer as
 * `TransportError`, and the retries that are safe.
 *
 * Two kinds of retry, both only where sending the request again cannot do its work twice:
 *
 * - a request whose connection broke before any answer came (reset, closed by the peer) is sent
 *   again at once, up to twice. That is the keep-alive race: the server closes an idle pooled
 *   connection just as a request goes out on it; the pool drops that socket, so the next try
 *   takes a fresh one. Only requests that are `repeatable` (reads, PUTs, enqueues and workflow
 *   creates carrying their idempotency key, lease calls without a claim) go again: the request
 *   may have been done.
 * - a transient failure (a 5xx, 408 or 429 answer, a timeout, a refused connection) is retried
 *   up to `retries` times after a backoff, or after the `Retry-After` the service asked for.
 *   Error answers are retried only for repeatable requests; a refused connection for any (it
 *   never reached the service).
 *
 * A caller's `signal` ends the call at once, retries included, with the signal's reason.
 */

import { JobqError, TransportError } from "./errors.js";
import { fetchExchanger, nodeExchanger, type Answer, type Exchanger } from "./http.js";
import type { Logger, Problem } from "./types.js";
import { Backoff, describe, isTransient, retryDelay, sleep } from "./retry.js";

/** Sends after the first of a request whose connection broke before any answer: one covers the
 * keep-alive race, one more a second stale pooled connection. */
const DROPPED_CONNECTION_RESENDS = 2;

export type Query = Record<string, string | number | boolean | null | undefined>;

export interface TransportOptions {
  baseUrl: string;
  apiKey: string | undefined;
  timeoutSeconds: number;
  retries: number;
  /** Sends with this instead of Node's `http`. */
  fetch: typeof fetch | undefined;
  /** Node's `http` only: the most connections open at once (unlimited when undefined). */
  connections: number | undefined;
  logger: Logger;
  userAgent: string;
}

export interface RequestOptions {
  body?: unknown;
  query?: Query;
  /** Safe to send twice (see the module doc); default: GET and PUT. */
  repeatable?: boolean;
  /** The answer may take this long on purpose (a long-poll): the timeout grows by it. */
  waitSeconds?: number;
  /** Transient failures retried after a backoff; default: the client's `retries`. */
  retries?: number;
  signal?: AbortSignal | undefined;
}

/** Sends requests to one service, as `TransportOptions` say. */
export class Transport {
  private readonly base: string;
  private readonly exchange: Exchanger;

  constructor(private readonly options: TransportOptions) {
    // Concatenated, not resolved, so a base URL with a path (behind a proxy) keeps it.
    this.base = options.baseUrl.replace(/\/+$/, "");
    this.exchange =
      options.fetch === undefined
        ? nodeExchanger(this.base, options.connections)
        : fetchExchanger(options.fetch);
  }

  get logger(): Logger {
    return this.options.logger;
  }

  /** Sends one request (retrying as the module doc says); answers the decoded JSON body. */
  async request<T>(method: string, path: string, options: RequestOptions = {}): Promise<T> {
    const repeatable = options.repeatable ?? (method === "GET" || method === "PUT");
    const retries = options.retries ?? this.options.retries;
    const backoff = new Backoff();
    let resends = 0;
    let retried = 0;
    for (;;) {
      try {
        return await this.once<T>(method, path, options);
      } catch (error) {
        if (options.signal?.aborted) throw error;
        const dropped = error instanceof TransportError && error.dropped && !error.neverSent;
        if (dropped && repeatable && resends < DROPPED_CONNECTION_RESENDS) {
          resends += 1;
          this.logger.info(
            `${method} ${path}: connection dropped before an answer (${describe(error)}); ` +
              "sending again",
          );
          continue;
        }
        const neverSent = error instanceof TransportError && error.neverSent;
        if (isTransient(error) && (repeatable || neverSent) && retried < retries) {
          retried += 1;
          const delay = retryDelay(error, backoff);
          this.logger.info(
            `${method} ${path}: ${describe(error)}; retrying in ${delay.toFixed(1)} s`,
          );
          await sleep(delay, options.signal);
          continue;
        }
        throw error;
      }
    }
  }

  private async once<T>(method: string, path: string, options: RequestOptions): Promise<T> {
    const headers: Record<string, string> = {
      accept: "application/json, application/problem+json",
      "user-agent": this.options.userAgent,
    };
    if (this.options.apiKey !== undefined) {
      headers["authorization"] = `Bearer ${this.options.apiKey}`;
    }
    let body: string | undefined;
    if (options.body !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(options.body);
    }
    const answer = await this.exchange({
      method,
      what: `${method} ${path}`,
      url: this.base + path + queryString(options.query),
      headers,
      body,
      timeoutSeconds: this.options.timeoutSeconds + Math.max(0, options.waitSeconds ?? 0),
      signal: options.signal,
    });
    const text = answer.text;
    if (answer.status >= 400) {
      throw new JobqError(answer.status, problemOf(answer, text), retryAfter(answer.retryAfter));
    }
    if (text === "") return undefined as T;
    try {
      return JSON.parse(text) as T;
    } catch (error) {
      // A body cut short (a proxy giving up, say): no usable answer, as if none came.
      throw new TransportError(`${method} ${path}: the answer is not JSON`, "BAD_JSON", {
        cause: error,
      });
    }
  }
}

function queryString(query: Query | undefined): string {
  if (query === undefined) return "";
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query)) {
    if (value !== undefined && value !== null) params.append(name, String(value));
  }
  const text = params.toString();
  return text === "" ? "" : `?${text}`;
}

/** The problem+json body of an error answer, or one made up from the status line and text. */
function problemOf(response: Answer, text: string): Problem {
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = undefined;
  }
  if (typeof body === "object" && body !== null && !Array.isArray(body)) {
    const fields = body as Partial<Problem>;
    return {
      ...fields,
      type: typeof fields.type === "string" ? fields.type : "about:blank",
      title: typeof fields.title === "string" ? fields.title : response.statusText || "Error",
      status: typeof fields.status === "number" ? fields.status : response.status,
      detail: typeof fields.detail === "string" ? fields.detail : "",
    };
  }
  return {
    type: "about:blank",
    title: response.statusText || "Error",
    status: response.status,
    detail: text.slice(0, 1000),
  };
}

/** `Retry-After` in seconds: delta-seconds or an HTTP date; `undefined` when absent or bad. */
function retryAfter(header: string | null): number | undefined {
  if (header === null) return undefined;
  const value = header.trim();
  if (/^\d+$/.test(value)) return Number(value);
  const at = Date.parse(value);
  return Number.isNaN(at) ? undefined : Math.max(0, (at - Date.now()) / 1000);
}
