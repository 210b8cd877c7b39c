"""The core's pure vocabulary: job states and transitions, bounds, value types and records (no I/O)."""
