"""HTTP routers: producers (jobs), workers (claim and lease calls), ops (queues, workers), health."""
