"""The queue core's services: units of work over the stores, coalescing, waiters, schedules."""
