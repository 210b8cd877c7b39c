"""The JOBQ_SCHEDULES file loader: it refuses what the API refuses, naming the entry's field."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.api.schedules_file import ScheduleFileError, load_schedules_file
from app.settings import Settings


@pytest.mark.parametrize("zone", ["localtime", "Factory", "posixrules", "right/UTC"])
def test_zones_only_a_host_knows_are_refused_naming_the_field(tmp_path: Path, zone: str) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(
        "[[schedules]]\n"
        'name = "ok"\ncron = "0 3 * * *"\ntimezone = "UTC"\n'
        'template = { queue = "q", type = "t" }\n'
        "[[schedules]]\n"
        f'name = "host-bound"\ncron = "0 3 * * *"\ntimezone = "{zone}"\n'
        'template = { queue = "q", type = "t" }\n',
        encoding="utf-8",
    )
    with pytest.raises(ScheduleFileError) as caught:
        load_schedules_file(path, Settings())
    assert "schedules[1].timezone" in str(caught.value) and zone in str(caught.value)


def test_canonical_zones_and_links_load(tmp_path: Path) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(
        "[[schedules]]\n"
        'name = "berlin"\ncron = "0 3 * * *"\ntimezone = "Europe/Berlin"\n'
        'template = { queue = "q", type = "t" }\n'
        "[[schedules]]\n"
        'name = "eastern"\ncron = "0 3 * * *"\ntimezone = "US/Eastern"\n'
        'template = { queue = "q", type = "t" }\n',
        encoding="utf-8",
    )
    loaded = load_schedules_file(path, Settings())
    assert [(name, spec.timing.timezone) for name, spec in loaded] == [
        ("berlin", "Europe/Berlin"),
        ("eastern", "US/Eastern"),
    ]
