"""The built-in dashboard at ``/dashboard``: server-rendered pages over the JobService, no build step.

``router.py`` holds the pages, their htmx fragments and the actions; ``session.py`` the sign-in,
the session cookie and the CSRF tokens; ``views.py`` the formatting the templates use (ages,
JSON, progress, the throughput chart). Templates and static files (htmx vendored, no CDN) ship
as package data beside them. None of it is in the OpenAPI document.
"""
