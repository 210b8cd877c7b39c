"""HTTP plumbing under the routes: the fast path, lean routes, strict JSON, body limit, timing."""
