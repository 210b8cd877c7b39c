"""Every setting is read somewhere, and the configuration reference (docs/reference/configuration.md)
lists each one with its default and meaning, as the class defines them."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.settings import Settings, settings_table

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [p for p in (ROOT / "app").rglob("*.py") if p.name != "settings.py"]


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_every_setting_is_read_outside_its_class(name: str) -> None:
    readers = [p for p in SOURCES if f"settings.{name}" in p.read_text(encoding="utf-8")]
    assert readers or name == "database_url", f"setting {name!r} is read nowhere"


def test_the_reference_lists_every_setting_as_the_class_defines_it() -> None:
    reference = (ROOT / "docs" / "reference" / "configuration.md").read_text(encoding="utf-8")
    assert settings_table() in reference, (
        "regenerate it: python -c 'from app.settings import settings_table; print(settings_table())'"
    )
