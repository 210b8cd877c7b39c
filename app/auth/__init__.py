"""Who is calling: API keys, their roles and queue scopes, the in-process key cache, the failure limiter."""
