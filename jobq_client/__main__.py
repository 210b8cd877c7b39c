"""``python -m jobq_client module:attr [--url URL]``: runs a Worker (same as ``jobq worker``)."""

import sys

from jobq_client.cli import main

sys.exit(main())
