"""Failure groups by error type and traceback fingerprint

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07

- ``jobq_failure_pattern(message)``: a failure's message with quoted values (``'…'`` where no
  letter or digit comes before the quote, ``"…"``, ```…```), URLs' query strings, e-mail
  addresses and every token holding a digit masked: ``<n>`` for a number (``42``, ``1.5``,
  ``10.0.3.7``), ``<id>`` for any other token with a digit (``ch_3c40a657f12715``,
  ``report-2026-12-07.csv``, a UUID), where a token is a run of letters, digits and
  ``_ . @ + ~ % # $ -``. ``GET /v1/failures`` groups failures without a traceback fingerprint by
  it: those sent without a traceback (or with one holding no frame the service reads), expired
  and timed-out leases, and every failure recorded before this release, whose events carry no
  fingerprint. ``jobq_mask_message`` (0017) masked numbers standing as words only, so
  ``Charge ch_3c40a657f12715 declined`` made a group per charge.
- No table changes and no backfill: a failure's traceback fingerprint is computed by the service
  when the worker fails the job and stored in the ``failed`` event's ``data`` (``fingerprint``),
  so events written before it group by their message.

Rolling deploys: expand only. Instances still on 0026's code group with ``jobq_mask_message``,
which stays (a later release drops it), and write failure events without a fingerprint, which
the new code groups by message; the new code's groups and their keys (``fingerprint``) are its
own, so a group key handed out by one release's ``GET /v1/failures`` is for that release's
``POST /v1/failures/{retry,cancel}`` (the old one takes ``pattern``, the new one
``fingerprint``).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Quoted values first (a quoted number is one value), then query strings and e-mail addresses
# (before their parts are taken for tokens), then tokens made of digits (and dots), then any
# other token holding a digit. app/domain/fingerprints.py says what a traceback groups by.
_FAILURE_PATTERN = r"""
CREATE FUNCTION jobq_failure_pattern(message text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
           regexp_replace(regexp_replace(
        left(message, 2000),
        '(?<![[:alnum:]])''[^'']*''(?![[:alnum:]])', '''?''', 'g'),
        '"[^"]*"', '"?"', 'g'),
        '`[^`]*`', '`?`', 'g'),
        '([[:alpha:]][[:alnum:]+.-]*://[^[:space:]?#''"<>]*)[?#][^[:space:]''"<>]*',
        '\1?<query>', 'g'),
        '[[:alnum:]._%+-]+@[[:alnum:].-]+\.[[:alpha:]]{2,}', '<email>', 'g'),
        '(?<![[:alnum:]_.@+~%#$-])[0-9]+(\.[0-9]+)*(?![[:alnum:]_@+~%#$-]|\.[[:alnum:]_])',
        '<n>', 'g'),
        '(?<![[:alnum:]_.@+~%#$-])[[:alnum:]_.@+~%#$-]*[0-9]([[:alnum:]_.@+~%#$-]*[[:alnum:]_])?',
        '<id>', 'g')
$$
"""


def upgrade() -> None:
    op.execute(_FAILURE_PATTERN)


def downgrade() -> None:
    op.execute("DROP FUNCTION jobq_failure_pattern(text)")
