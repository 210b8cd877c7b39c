package jobq

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// Shared completes: a worker has at most one complete request of its own in flight, carrying
// every job whose handler returned a result since the one before went out (up to the
// service's per-call limit); while it is out, the next batch grows, so a wide, busy worker
// makes one request per batch, not one per job. Its claim_next asks for every free slot, the
// batch's own among them. One goroutine, the run's completer, sends them; a supervisor queues
// its job and ends. Fails and releases, and results that are not JSON (failed instead), go one
// job per request (settle in leases.go).
//
// Ownership: only a job whose lease was still held when its handler returned joins a batch
// (once its handler has returned, a heartbeat's ok: false no longer touches it: the complete
// gets the service's verdict itself, item by item). The jobs a complete claims are taken
// (held, their slots counted) in the same step that ends the claim's reservation, before the
// batch's slots are given back.

// sharedComplete is one job waiting for, or carried by, a shared complete.
type sharedComplete struct {
	h      *heldJob
	result json.RawMessage
}

// completable answers the handler's result as JSON and marks the job done, or false when it
// must be settled on its own: the lease is lost (given up) or the result is not JSON (failed).
func (k *leaseKeeper) completable(h *heldJob, result any) (json.RawMessage, bool) {
	encoded, err := marshalValue(result)
	if err != nil {
		return nil, false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if h.lost {
		return nil, false
	}
	h.done = true
	return encoded, true
}

// completeShared queues the job's complete for the run's completer.
func (w *Worker) completeShared(rs *workerRun, h *heldJob, result json.RawMessage) {
	w.mu.Lock()
	rs.toComplete = append(rs.toComplete, sharedComplete{h, result})
	w.mu.Unlock()
	select {
	case rs.completeQueued <- struct{}{}:
	default: // the completer has been told already
	}
}

// runCompleter sends the shared completes until quit is closed and the queue is empty. One
// goroutine for the whole run, rather than whichever supervisor found the queue empty: its
// stack, grown once by the HTTP call and the decoding of its answer, stays grown.
func (w *Worker) runCompleter(rs *workerRun, quit <-chan struct{}) {
	for {
		select {
		case <-rs.completeQueued:
			w.sendCompletes(rs)
		case <-quit:
			w.sendCompletes(rs)
			return
		}
	}
}

// sendCompletes sends the queued completes, one request at a time, until the queue is empty.
func (w *Worker) sendCompletes(rs *workerRun) {
	claimNext := !w.cfg.DisableClaimNext
	for {
		if claimNext && rs.keeper.refusesClaimNext() {
			claimNext = false
		}
		w.mu.Lock()
		n := len(rs.toComplete)
		if n == 0 {
			w.mu.Unlock()
			return
		}
		if n > maxLeasesPerCall {
			n = maxLeasesPerCall
		}
		batch := rs.toComplete[:n:n]
		if n == len(rs.toComplete) {
			rs.toComplete = nil // the next batch starts a new array: this one is the request's
		} else {
			rs.toComplete = rs.toComplete[n:]
		}
		next := w.claimForBatch(rs, n, claimNext)
		w.mu.Unlock()

		claimed := rs.keeper.completeMany(batch, next)
		// Started before the batch's slots are given back, so no claim counts them twice.
		w.take(rs, claimed, reservedBy(next))
		jobs := make([]*heldJob, n)
		for i := range batch {
			jobs[i] = batch[i].h
		}
		w.finish(rs, jobs, next != nil)
	}
}

// claimForBatch reserves the claim a shared complete of n jobs makes for the free slots,
// theirs among them (counted as handed over until it is answered); nil while stopping. Called
// with w.mu held.
func (w *Worker) claimForBatch(rs *workerRun, n int, claimNext bool) *ClaimParams {
	if !claimNext || rs.stopped {
		return nil
	}
	rs.handingOver += n
	free := w.free(rs)
	if free > maxClaimJobs {
		free = maxClaimJobs
	}
	if free <= 0 {
		rs.handingOver -= n
		return nil
	}
	rs.claiming += free
	params := w.claimParams(free)
	return &params
}

// completeMany completes the batch's jobs in one request, retrying transient errors as send
// does (the claim on the first try only), and answers the jobs its claim took. When the
// service refuses the request for good (one result too large, say), each job is completed on
// its own, so that only the jobs the service refuses are failed.
func (k *leaseKeeper) completeMany(batch []sharedComplete, next *ClaimParams) []*Job {
	items := make([]CompleteItem, len(batch))
	for i, c := range batch {
		items[i] = CompleteItem{LeaseRef: c.h.ref, Result: c.result}
	}
	ctx := context.Background() // settling must go through while the worker stops
	deadline := time.Now().Add(settleRetryFor)
	var b backoff
	var answer *SettleResults
	for {
		ask := next
		next = nil
		var err error
		answer, err = k.client.Complete(ctx, k.workerID, items, ask)
		if err == nil {
			break
		}
		var apiErr *Error
		refused := errors.As(err, &apiErr) && !apiErr.Transient()
		switch {
		case ask != nil && refused:
			k.claimNextFailed(apiErr)
			continue
		case isTransient(err) && time.Now().Before(deadline):
			delay := retryDelay(err, &b)
			k.logf("worker %s: complete of %d jobs failed (%v); retrying in %s", k.workerID, len(items), err, delay.Round(time.Millisecond))
			_ = sleep(ctx, delay)
			continue
		case refused:
			for _, c := range batch {
				k.complete(c.h, c.result, nil)
			}
			return nil
		}
		k.logf("worker %s: complete of %d jobs failed: %v; they return to the queue when their leases expire", k.workerID, len(items), err)
		return nil
	}
	for i, r := range answer.Results {
		if !r.OK && i < len(batch) {
			k.logf("worker %s: complete of job %d refused: %v", k.workerID, batch[i].h.ref.JobID, lossReason(r))
		}
	}
	if answer.ClaimError != nil {
		k.logf("worker %s: the claim after completing %d jobs failed: %v", k.workerID, len(items), answer.ClaimError)
	}
	return answer.Claimed
}
