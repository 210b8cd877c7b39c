"""A job service on the session database, for tests that drive the queue core directly."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.queue.services import Services
from tests.integration.helpers import service


@pytest.fixture
def svc(clean_db: AsyncEngine, driver_pool: Any) -> Services:
    """The service on emptied tables."""
    return service(clean_db, driver_pool)
