"""The request models that make jobs are built once per set of limits, from exactly those limits."""

from __future__ import annotations

import inspect
import re

from app.api import job_models as module
from app.api import webhook_models
from app.settings import Settings


def _read(function: object) -> set[str]:
    return set(re.findall(r"settings\.([a-z_]+)", inspect.getsource(function)))  # type: ignore[arg-type]


def test_the_cache_key_holds_every_setting_the_models_read() -> None:
    read = _read(module._build) | _read(webhook_models.callback_url_type)
    read |= _read(webhook_models.address_policy)
    assert read <= set(module._LIMITS), read - set(module._LIMITS)


def test_apps_with_the_same_limits_share_models_and_others_get_their_own() -> None:
    url = "postgresql://nobody@127.0.0.1/none"
    first = module.job_models(Settings(database_url=url))
    assert module.job_models(Settings(database_url=url)) is first
    other = module.job_models(Settings(database_url=url, workflow_max_steps=5))
    assert other is not first
    steps = other.workflow.model_fields["steps"].metadata
    assert any(getattr(m, "max_length", None) == 5 for m in steps)
