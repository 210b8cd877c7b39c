"""The bookstore's price-list update as a checkpointed jobq job (see README.md here)."""
