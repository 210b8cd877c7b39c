"""The app's typed state: its settings from the start, and what the lifespan builds while it runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.applications import Starlette

from app.auth.keyring import KeyRing
from app.auth.limiter import FailureLimiter
from app.maintenance.runner import LoopRunner
from app.queue.events import Subscriber
from app.queue.services import Services
from app.queue.waiters import WaiterHub
from app.settings import Settings
from app.wakeup.control import ControlChannel


@dataclass
class Runtime:
    """What the lifespan builds: the services, the waiters, the control connection, the loops, the keys."""

    services: Services
    hub: WaiterHub
    control: ControlChannel
    runner: LoopRunner
    keys: KeyRing
    failures: FailureLimiter
    # Called from the signal handler: parked claims answer at once instead of holding the exit.
    begin_shutdown: Callable[[], None]


@dataclass
class AppState:
    """Everything the app keeps between requests, under ``app.state.jobq``."""

    settings: Settings
    runtime: Runtime | None = None
    # Subscribers of the job events (the app's metrics), subscribed by the lifespan at start-up.
    subscribers: list[Subscriber] = field(default_factory=list)

    def running(self) -> Runtime:
        """The runtime; fails when the lifespan has not started (or has ended)."""
        if self.runtime is None:
            raise RuntimeError("the app is not running: its lifespan has not started")
        return self.runtime


def app_state(app: Starlette) -> AppState:
    """The app's state, as ``create_app`` stored it."""
    state = app.state.jobq
    if not isinstance(state, AppState):
        raise TypeError("app.state.jobq is not an AppState: build the app with create_app()")
    return state
