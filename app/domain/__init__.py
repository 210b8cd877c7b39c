"""The core's pure parts: no I/O, no database; what the services and the API reason with."""
