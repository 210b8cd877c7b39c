"""The helpers that read the pages' code blocks (tests/docs_examples.py): what they find, how they
split shell and read curl, and what counts as an answer matching the README's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.docs_examples import (
    ELLIPSIS,
    Block,
    IdMap,
    all_blocks,
    block_kind,
    blocks_of,
    documents,
    expand_variables,
    map_request,
    mismatches,
    parse_curl,
    relaxed_json,
    request_job_ids,
    shell_commands,
)

PAGE = """# Title

<!-- example: not run (installs things) -->
```sh
pip install jobq
```

- An item:

  ```json
  {"a": 1}
  ```

Text.

    indented code

<!-- example: not run () -->
```
plain
```
"""


def test_every_code_block_is_found_with_its_line_language_and_marker() -> None:
    blocks = blocks_of(PAGE, "page.md")
    assert [(b.line, b.lang, b.fenced, b.first_line) for b in blocks] == [
        (4, "sh", True, "pip install jobq"),
        (10, "json", True, '{"a": 1}'),  # a list item's fence, its indentation removed
        (16, "", False, "indented code"),  # an indented block is a code block too
        (19, "", True, "plain"),
    ]
    assert blocks[1].text == '{"a": 1}\n'
    assert [b.not_run_reason for b in blocks] == ["installs things", None, None, None]
    assert blocks[3].marker == "not run ()"  # a marker without a reason is not a reason
    assert blocks[0].describe() == "page.md:4 (sh) `pip install jobq`"


def test_docs_pages_added_later_are_read_after_the_readme(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("```python\nx = 1\n```\n", encoding="utf-8")
    (tmp_path / "docs" / "guide").mkdir(parents=True)
    (tmp_path / "docs" / "guide" / "b.md").write_text("```sql\nSELECT 1\n```\n", encoding="utf-8")
    (tmp_path / "docs" / "a.md").write_text("no code\n", encoding="utf-8")
    (tmp_path / "docs" / "image.png").write_bytes(b"\x89PNG")
    assert [p.relative_to(tmp_path).as_posix() for p in documents(tmp_path)] == [
        "README.md",
        "docs/a.md",
        "docs/guide/b.md",
    ]
    assert [(b.path, b.lang) for b in all_blocks(tmp_path)] == [
        ("README.md", "python"),
        ("docs/guide/b.md", "sql"),
    ]


SHELL = """# a comment
curl -s -X POST localhost:8000/v1/jobs -H 'content-type: application/json' \\
  -d '{"queue": "q", "note": "# not a comment"}'   # a trailing comment
# -> 201 {"id": 1,
#         "status": "pending", ...}
curl -X PUT localhost:8000/v1/schedules/x -d '{
  "cron": "30 2 * * *"}'
"""


def test_shell_blocks_split_into_commands_with_their_answers() -> None:
    first, second = shell_commands(SHELL)
    assert first.line == 1 and second.line == 5
    _, words = first.split()
    assert words[-1] == '{"queue": "q", "note": "# not a comment"}'
    assert first.expect is not None and first.expect.status == 201
    assert first.expect.body == {"id": 1, "status": "pending", ELLIPSIS: None}
    assert second.expect is None
    assert second.split()[1][-1] == '{\n  "cron": "30 2 * * *"}'  # a quote spanning lines


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("# -> 200 {}\n", "before any command"),
        ("curl x\n# -> 200\n# -> 201\n", "a second answer"),
        ("curl -d '{\n", "never closed"),
        ("curl x\n# -> ok\n", "status code"),
    ],
)
def test_malformed_shell_blocks_are_refused(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        shell_commands(text)


def test_variables_expand_as_sh_expands_them() -> None:
    variables = {"KEY": "k1"}
    assert expand_variables('-H "Bearer $KEY" ${KEY}x', variables) == '-H "Bearer k1" k1x'
    assert expand_variables("'$KEY'", variables) == "'$KEY'"  # single quotes keep it
    assert expand_variables('"$UNSET"', variables) == '""'  # unset is empty


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("curl localhost:8000/v1/queues\n", "curl"),
        ("A=1  # why\nJOBQ_B=2\n", "settings"),
        ("KEY=$(jobq keys create)\n", None),  # a command substitution runs a command
        ("curl x | jq .\n", None),
        ("pip install jobq && jobq serve\n", None),
    ],
)
def test_shell_blocks_run_when_they_are_curl_calls_or_settings(text: str, kind: str | None) -> None:
    assert block_kind(Block("p.md", 1, "sh", text, None)) == kind


@pytest.mark.parametrize(
    ("lang", "kind"),
    [("python", "python"), ("sql", "sql"), ("toml", "toml"), ("yml", "yaml"), ("", None)],
)
def test_other_blocks_run_by_language(lang: str, kind: str | None) -> None:
    assert block_kind(Block("p.md", 1, lang, "x\n", None)) == kind


def test_curl_calls_are_read_as_curl_sends_them() -> None:
    request = parse_curl(["curl", "-s", "localhost:8000/v1/jobs", "-d", '{"a": 1}'])
    assert (request.method, request.url) == ("POST", "http://localhost:8000/v1/jobs")
    # Without -H content-type curl sends a form: the service must then refuse it.
    assert request.headers == [("Content-Type", "application/x-www-form-urlencoded")]
    request = parse_curl(
        ["curl", "-X", "PUT", "-H", "Content-Type: application/json", "u", "-d", "{}"]
    )
    assert (request.method, request.headers) == ("PUT", [("Content-Type", "application/json")])
    assert parse_curl(["curl", "http://127.0.0.1:8000/metrics"]).method == "GET"


@pytest.mark.parametrize(
    ("words", "problem"),
    [
        (["curl", "-k", "u"], "does not know: -k"),
        (["curl", "-d", "a", "-d", "b", "u"], "more than one -d"),
        (["curl", "-d", "@body.json", "u"], "from a file"),
        (["curl", "-H", "nocolon", "u"], "without a colon"),
        (["curl", "-s"], "without a URL"),
    ],
)
def test_curl_options_it_does_not_understand_are_refused(words: list[str], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_curl(words)


def test_answers_with_ellipses_are_read() -> None:
    assert relaxed_json('{"jobs": [...], "c": {...}, "l": "9f1c…", "n": [1, …]}') == {
        "jobs": [ELLIPSIS],
        "c": {ELLIPSIS: None},
        "l": "9f1c…",
        "n": [1, ELLIPSIS],
    }
    with pytest.raises(ValueError, match="outside an object"):
        relaxed_json("...")


def _mismatches(
    expected: str, actual: Any, ids: IdMap | None = None, kind: str = "job"
) -> list[str]:
    return mismatches(relaxed_json(expected), actual, ids=ids or IdMap(), top_kind=kind)


def test_an_answer_matches_when_the_fields_shown_match() -> None:
    actual = {"id": 7, "status": "pending", "attempts": 0, "run_at": "2026-01-01T00:00:00Z"}
    assert _mismatches('{"id": 1, "status": "pending", ...}', actual) == []
    assert _mismatches('{"run_at": "2030-12-02T01:30:00Z"}', actual) == []  # times: any time
    assert _mismatches('{"attempts": 1}', actual) == [
        "$.attempts: the README shows 1, the service answered 0"
    ]
    assert _mismatches('{"queue": "q"}', actual) == [
        "$.queue: missing (fields: id, status, attempts, run_at)"
    ]
    assert _mismatches('{"lease_id": "9f1c…"}', {"lease_id": None}) == [
        "$.lease_id: expected a string, got None"
    ]
    assert _mismatches('{"ok": true}', {"ok": 1}) != []  # a bool is not a number
    assert _mismatches('{"last_run_at": null}', {"last_run_at": "2026-01-01T00:00:00Z"}) != []


def test_lists_match_item_by_item_and_an_ellipsis_allows_more() -> None:
    assert _mismatches('{"jobs": [...]}', {"jobs": []}) == []
    assert _mismatches('{"jobs": [{"ok": true}, ...]}', {"jobs": [{"ok": True}, {}]}) == []
    assert _mismatches('{"jobs": [{"ok": true}]}', {"jobs": [{"ok": True}, {}]}) == [
        "$.jobs: 1 items expected, got 2"
    ]
    assert _mismatches('{"jobs": [{"id": 2, ...}]}', {"jobs": []}) == [
        "$.jobs: 1 items expected, got 0"
    ]


def test_ids_are_learnt_once_and_then_held_to() -> None:
    ids = IdMap()
    assert _mismatches('{"id": 1}', {"id": 11}, ids) == []
    assert _mismatches('{"jobs": [{"id": 1}]}', {"jobs": [{"id": 11}]}, ids) == []
    assert _mismatches('{"results": [{"job_id": 1}]}', {"results": [{"job_id": 12}]}, ids) == [
        "$.results[0].job_id: the README's job 1 is job 11 of this run, but the service answered 12"
    ]
    assert _mismatches('{"id": 2}', {"id": 11}, ids) == [
        "$.id: the README shows job 2 where the service answered job 11, which the README "
        "called 1 before"
    ]
    assert _mismatches('{"depends_on": [1, 3]}', {"depends_on": [11, 13]}, ids) == []
    assert ids.real("job", 3) == 13
    # A workflow's own id is of another kind than the jobs' ids inside it.
    assert (
        _mismatches(
            '{"id": 1, "steps": [{"id": 1}]}', {"id": 5, "steps": [{"id": 11}]}, ids, "workflow"
        )
        == []
    )
    assert ids.real("workflow", 1) == 5


def test_requests_are_sent_with_this_runs_ids_and_their_placeholders_filled() -> None:
    ids = IdMap()
    ids.learn("job", 1, 11)
    ids.learn("job", 41, 141)
    body = {
        "depends_on": [41],
        "leases": [{"job_id": 1, "lease_id": "<lease_id from claim>"}],
    }
    assert request_job_ids(body) == [41]
    mapped, problems = map_request(body, ids, lambda name, item: f"lease-of-{item['job_id']}")
    assert problems == []
    assert mapped == {"depends_on": [141], "leases": [{"job_id": 11, "lease_id": "lease-of-11"}]}
    _, problems = map_request({"job_id": 9}, ids, lambda name, item: None)
    assert problems == ["job 9 was never shown by an earlier example"]
