"""The JOBQ_SCHEDULES file: its schedules read from TOML or JSON and checked like API requests."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from app.api.schedule_models import schedule_models, schedule_spec
from app.domain.cron import ScheduleError, ScheduleSpec
from app.errors import field_name
from app.http.strict_json import parse_strict_json
from app.settings import Settings


class ScheduleFileError(ValueError):
    """The JOBQ_SCHEDULES file cannot be used; the message is one line naming the file and field."""


def _problems(errors: Sequence[Mapping[str, Any]], *, strip_body: bool = False) -> str:
    parts = []
    for error in errors:
        loc = tuple(error.get("loc") or ())
        if strip_body and loc[:1] == ("body",):
            loc = loc[1:]
        where = field_name(loc) or "file"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "; ".join(parts)


def load_schedules_file(path: Path, settings: Settings) -> list[tuple[str, ScheduleSpec]]:
    """The schedules of a TOML (``.toml``) or JSON (``.json``) file, checked like API requests.

    ``ScheduleFileError`` says in one line what is wrong and where: the file (unreadable, not
    TOML / JSON, the wrong shape) or the field (``schedules[2].cron: ...``), including names
    given twice.
    """
    shown = str(path)
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".json"):
        raise ScheduleFileError(f"{shown}: must be a .toml or .json file")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ScheduleFileError(f"{shown}: cannot be read ({exc.strerror or exc})") from None
    content: Any
    if suffix == ".toml":
        try:
            content = tomllib.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise ScheduleFileError(f"{shown}: is not UTF-8") from None
        except tomllib.TOMLDecodeError as exc:
            raise ScheduleFileError(f"{shown}: not valid TOML: {exc}") from None
    else:
        try:
            content = parse_strict_json(raw, max_depth=settings.max_json_depth)
        except RequestValidationError as exc:
            raise ScheduleFileError(
                f"{shown}: {_problems(exc.errors(), strip_body=True)}"
            ) from None
        except json.JSONDecodeError as exc:
            raise ScheduleFileError(f"{shown}: not valid JSON: {exc}") from None
    try:
        parsed = schedule_models(settings).file.model_validate(content)
    except ValidationError as exc:
        raise ScheduleFileError(f"{shown}: {_problems(exc.errors())}") from None
    entries: list[tuple[str, ScheduleSpec]] = []
    seen: set[str] = set()
    for index, entry in enumerate(parsed.schedules):
        name = entry.name
        if name in seen:
            raise ScheduleFileError(f"{shown}: schedules[{index}].name: {name!r} is given twice")
        seen.add(name)
        try:
            entries.append((name, schedule_spec(entry)))
        except ScheduleError as exc:
            raise ScheduleFileError(
                f"{shown}: schedules[{index}].{exc.field}: {exc.message}"
            ) from None
    return entries
