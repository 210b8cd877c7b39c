"""Refuses a body whose declared Content-Length is over the limit with a 413 problem, before reading it.

Bodies without a length (chunked) are counted while they stream by FastAPI's ``max_body_size``;
that path already answers through our problem handlers, the declared-length path does not.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import problem


class DeclaredBodyLimit:
    """ASGI middleware: 413 problem+json when ``Content-Length`` exceeds ``max_body_size``."""

    def __init__(self, app: ASGIApp, *, max_body_size: int) -> None:
        self.app = app
        self.max_body_size = max_body_size

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == b"content-length":
                    try:
                        declared = int(value)
                    except ValueError:
                        declared = -1
                    if declared > self.max_body_size or declared < 0:
                        status = 413 if declared > self.max_body_size else 400
                        response = problem(
                            status,
                            "Content Too Large" if status == 413 else "Bad Request",
                            f"the body may be at most {self.max_body_size} bytes"
                            if status == 413 else "malformed Content-Length",
                            headers={"Connection": "close"},
                        )
                        await response(scope, receive, send)
                        return
                    break
        await self.app(scope, receive, send)
