"""Request body size limit, enforced while reading: a declared or streamed body past it gets a 413 problem.

FastAPI's own ``max_body_size`` sits outside the app's middleware and answers in plain text, so
the limit lives here, where both paths end in our problem+json handlers.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import problem


class BodyLimit:
    """ASGI middleware: refuses bodies over ``max_body_size`` bytes without buffering them."""

    def __init__(self, app: ASGIApp, *, max_body_size: int) -> None:
        self.app = app
        self.max_body_size = max_body_size

    def _too_large(self) -> HTTPException:
        return HTTPException(413, f"the body may be at most {self.max_body_size} bytes")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and (declared < 0 or declared > self.max_body_size):
            too_large = declared > self.max_body_size
            response = problem(
                413 if too_large else 400,
                "Content Too Large" if too_large else "Bad Request",
                self._too_large().detail if too_large else "malformed Content-Length",
                headers={"Connection": "close"},
            )
            await response(scope, receive, send)
            return

        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_size:
                    # Raised inside the route's body read, so the app's handlers answer it.
                    raise self._too_large()
            return message

        await self.app(scope, counting_receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return -1
    return None
