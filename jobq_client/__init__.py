"""Reference Python client for jobq (HTTP only, depends on httpx; never imports ``app``)."""
