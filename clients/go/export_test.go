package jobq

// QueuedCompletes answers how many jobs wait for the next shared complete (0 when the worker
// is not running), so tests can see a batch form without timing it.
func (w *Worker) QueuedCompletes() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.run == nil {
		return 0
	}
	return len(w.run.toComplete)
}
