"""Temporary re-export of ``app.domain.bounds`` for app/dashboard/router.py until its split lands."""

# TEMPORARY (issue 19): another branch is splitting app/dashboard; remove this module once the
# dashboard imports app.domain.bounds directly.
from app.domain.bounds import MAX_BIGINT as MAX_BIGINT
from app.domain.bounds import instant_in_window as instant_in_window
