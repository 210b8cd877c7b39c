"""Temporary re-export of ``app.domain.types`` for app/dashboard/router.py until its split lands."""

# TEMPORARY (issue 19): another branch is splitting app/dashboard; remove this module once the
# dashboard imports app.domain.types directly.
from app.domain.types import JobSearch as JobSearch
