"""The bench's --only and --rows choices: known names in the table's order, unknown ones refused."""

from __future__ import annotations

import pytest

from bench.__main__ import parser


def test_rows_runs_the_named_rows_in_the_tables_order() -> None:
    args = parser().parse_args(["--rows", "drain_16_max50_keys, drain_16_max50"])
    assert args.rows == ("drain_16_max50", "drain_16_max50_keys")
    assert parser().parse_args([]).rows is None


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--rows", "drain_99", "unknown row(s) drain_99"),
        ("--rows", " , ", "name at least one row"),
        ("--only", "rows,nope", "unknown section(s) nope"),
    ],
)
def test_unknown_or_empty_choices_are_refused(
    flag: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args([flag, value])
    assert message in capsys.readouterr().err
