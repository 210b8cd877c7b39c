/** A handler's error as `POST /v1/fail` records it. */

import type { ErrorDetail } from "./types.js";

const ERROR_TYPE_MAX_CHARS = 200; // the service refuses a longer type name
const ERROR_TEXT_MAX_CHARS = 65536; // the service's limit of a fail item's error text
// The service keeps the last 16000 characters of a traceback, as Python's ends with the
// exception line; a JavaScript stack starts with it, so the client keeps the first ones.
const TRACEBACK_MAX_CHARS = 16000;
const CAUSE_DEPTH_MAX = 8;

/**
 * An error as `POST /v1/fail` takes it: its type (the error's `name`, or its class's name when
 * the name is the generic `Error`), its message, and its stack followed by its causes' stacks.
 */
export function errorDetail(error: unknown): ErrorDetail {
  if (!(error instanceof Error)) {
    return { type: "NonError", message: `thrown: ${show(error)}`.slice(0, ERROR_TEXT_MAX_CHARS) };
  }
  const parts: string[] = [];
  const seen = new Set<unknown>();
  for (let e: unknown = error; e !== undefined && parts.length < CAUSE_DEPTH_MAX; ) {
    if (seen.has(e)) break;
    seen.add(e);
    const text = e instanceof Error ? (e.stack ?? `${typeName(e)}: ${e.message}`) : show(e);
    parts.push(parts.length === 0 ? text : `Caused by: ${text}`);
    e = e instanceof Error ? e.cause : undefined;
  }
  return {
    type: typeName(error).slice(0, ERROR_TYPE_MAX_CHARS),
    message: error.message.slice(0, ERROR_TEXT_MAX_CHARS),
    traceback: parts.join("\n").slice(0, TRACEBACK_MAX_CHARS),
  };
}

function typeName(error: Error): string {
  const constructorName = error.constructor?.name;
  if (error.name && error.name !== "Error") return error.name;
  return constructorName || "Error";
}

function show(value: unknown): string {
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}
