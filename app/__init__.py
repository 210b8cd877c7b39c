"""jobq: an HTTP job-queue service on PostgreSQL."""
