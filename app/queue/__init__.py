"""The queue core: named SQL, the repository that runs it, and the job states."""
