"""The uvicorn server behind ``jobq serve``: releases parked claims on SIGTERM, exits 0 when done."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Generator
from types import FrameType

import uvicorn
from fastapi import FastAPI

from app.api.state import app_state


class JobqServer(uvicorn.Server):
    """A uvicorn ``Server`` that tells the app at the first signal, and does not die by it.

    uvicorn waits for open requests before it runs the lifespan shutdown, so a long-poll parked
    for 20 s would hold the deploy: at SIGTERM we first close the app's waiter hub (every parked
    claim answers an empty list at once) and then let uvicorn shut down as usual. uvicorn also
    re-raises the caught signal after a clean shutdown; we keep its handlers but not that, so a
    clean shutdown exits with status 0.
    """

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self.fastapi_app = app

    @classmethod
    def for_app(cls, app: FastAPI, *, log_level: str = "info") -> JobqServer:
        """A server for this app on the host and port of its settings."""
        settings = app_state(app).settings
        config = uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level=log_level,
            # No logging config of uvicorn's own: its records go to the root handler `jobq` set
            # up (app/logs.py). Nor its access line, one per request: the app's own access log
            # writes the ones JOBQ_LOG_ACCESS asks for (app/http/access_log.py).
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=int(settings.shutdown_grace_seconds),
            timeout_keep_alive=settings.http_keepalive_seconds,
        )
        return cls(config, app)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Releases parked claims (on the event loop), then starts uvicorn's shutdown."""
        runtime = app_state(self.fastapi_app).runtime
        if runtime is not None:
            runtime.begin_shutdown()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """Routes SIGINT / SIGTERM to :meth:`handle_exit` while serving, without re-raising after."""
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)
