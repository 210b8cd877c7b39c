"""Background loops (reaper, pruner, promoter) and the runner that supervises them."""
