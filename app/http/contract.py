"""The answers every route may give besides its own, written into the OpenAPI document once.

Authentication, body limits and content types are checked around the routes, not by them, so
FastAPI cannot see their answers. Every operation that needs a key documents 401, 403 and 429,
and every operation with a body documents 413 and 415; all of them are problem+json. Clients
and contract testers (schemathesis in CI) then see the same codes the service sends.
"""

from __future__ import annotations

from typing import Any

_PROBLEM_BODY: dict[str, Any] = {"application/problem+json": {"schema": {"type": "object"}}}

_AUTH = {
    "401": "No valid API key (WWW-Authenticate: Bearer)",
    "403": "The key's role or queue scopes do not allow this",
    "429": "Too many failed authentications from this address (Retry-After)",
}
_BODY = {
    "413": "The body is larger than JOBQ_MAX_BODY_BYTES",
    "415": "The body is not JSON",
    "422": "A field is invalid (named in errors)",
}


def document_problems(schema: dict[str, Any]) -> dict[str, Any]:
    """Adds the problem answers each operation can give to an OpenAPI document (in place)."""
    for item in schema.get("paths", {}).values():
        for operation in item.values():
            responses = operation.setdefault("responses", {})
            extra = {}
            if operation.get("security"):
                extra.update(_AUTH)
            if "requestBody" in operation:
                extra.update(_BODY)
            for code, description in extra.items():
                responses.setdefault(code, {"description": description, "content": _PROBLEM_BODY})
            if "422" in responses and "application/problem+json" not in responses["422"].get(
                "content", {}
            ):
                # FastAPI's default 422 says application/json; every 422 jobq sends is a problem.
                responses["422"] = {"description": _BODY["422"], "content": _PROBLEM_BODY}
    return schema
