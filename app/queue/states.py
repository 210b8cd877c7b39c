"""Temporary re-export of ``app.domain.states`` for app/dashboard/router.py until its split lands."""

# TEMPORARY (issue 19): another branch is splitting app/dashboard; remove this module once the
# dashboard imports app.domain.states directly.
from app.domain.states import BULK_STATES as BULK_STATES
from app.domain.states import BulkAction as BulkAction
from app.domain.states import JobStatus as JobStatus
from app.domain.states import bulk_states as bulk_states
