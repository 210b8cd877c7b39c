package jobq

// The worker's slots: claiming jobs for free ones (the claim loop, and the claims riding on
// settle calls) and running each claimed job's handler in one (see the Worker's overview in
// worker.go).

import (
	"context"
	"runtime/debug"
	"time"
)

// -- claiming -------------------------------------------------------------------------------

// free answers the slots neither taken by a held job nor asked for by a claim in flight.
// Called with w.mu held.
func (w *Worker) free(rs *workerRun) int {
	return w.cfg.Concurrency - (rs.holding - rs.handingOver) - rs.claiming
}

func (w *Worker) claimParams(maxJobs int) ClaimParams {
	return ClaimParams{Queues: w.cfg.Queues, MaxJobs: maxJobs, Lease: w.cfg.Lease}
}

// claimLoop long-polls for jobs while slots are free, until ctx is done (nil) or the
// service refuses a claim for good (that error).
func (w *Worker) claimLoop(ctx context.Context, rs *workerRun) error {
	var b backoff
	for {
		w.mu.Lock()
		if rs.stopped {
			w.mu.Unlock()
			return nil
		}
		n := w.free(rs)
		if n > maxClaimJobs {
			n = maxClaimJobs
		}
		if n > 0 {
			rs.claiming += n
		}
		w.mu.Unlock()
		if n <= 0 {
			select {
			case <-rs.slotFree:
				continue
			case <-ctx.Done():
				return nil
			}
		}
		started := time.Now()
		params := w.claimParams(n)
		params.Wait = w.cfg.PollWait
		jobs, err := w.client.Claim(ctx, w.cfg.WorkerID, params)
		w.take(rs, jobs, n)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !isTransient(err) {
				w.logf("worker %s: claim refused: %v", w.cfg.WorkerID, err)
				return err
			}
			delay := retryDelay(err, &b)
			w.logf("worker %s: claim failed (%v); retrying in %s", w.cfg.WorkerID, err, delay.Round(time.Millisecond))
			if sleep(ctx, delay) != nil {
				return nil
			}
			continue
		}
		b.Reset()
		if elapsed := time.Since(started); len(jobs) == 0 && elapsed < idlePause {
			// Answered empty at once (no wait asked, or the service is shutting down).
			if sleep(ctx, idlePause-elapsed) != nil {
				return nil
			}
		}
	}
}

// claimNext reserves the claim a settle call makes for the slot it frees and any other free
// one; nil while stopping (or when the service refuses claim_next).
func (w *Worker) claimNext(rs *workerRun) *ClaimParams {
	if w.cfg.DisableClaimNext || rs.keeper.refusesClaimNext() {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if rs.stopped {
		return nil
	}
	n := w.free(rs) + 1 // + 1: the settling job's own slot
	if n > maxClaimJobs {
		n = maxClaimJobs
	}
	if n <= 0 {
		return nil
	}
	rs.claiming += n
	rs.handingOver++
	params := w.claimParams(n)
	return &params
}

// take runs claimed jobs, ending the reservation of reserved slots of the claim that took
// them in the same step, so no other claim counts those slots twice. Once stopping, it hands
// the jobs straight back.
func (w *Worker) take(rs *workerRun, jobs []*Job, reserved int) {
	var start []*heldJob
	var back []ReleaseItem
	w.mu.Lock()
	rs.claiming -= reserved
	for _, job := range jobs {
		if rs.stopped {
			back = append(back, ReleaseItem{LeaseRef: LeaseRef{JobID: job.ID, LeaseID: job.LeaseID}})
			continue
		}
		rs.holding++
		rs.wg.Add(1)
		start = append(start, rs.keeper.hold(job, rs.base))
	}
	w.mu.Unlock()
	for _, h := range start {
		go w.supervise(rs, h)
	}
	if len(back) > 0 {
		if _, err := w.client.Release(context.Background(), w.cfg.WorkerID, back, nil); err != nil {
			w.logf("worker %s: handing back %d jobs claimed as it stopped failed (%v); they return when their leases expire",
				w.cfg.WorkerID, len(back), err)
		}
	}
}

// -- one job --------------------------------------------------------------------------------

// supervise runs the job's handler, then has the job settled by what became of it: a job
// whose handler returned a result joins the shared completes (completes.go), any other is
// settled in a request of its own.
func (w *Worker) supervise(rs *workerRun, h *heldJob) {
	var next *ClaimParams
	shared := false
	defer func() {
		if !shared { // else the shared complete that carries the job finishes it
			w.finish(rs, []*heldJob{h}, next != nil)
		}
	}()
	job := h.jc.Job
	handler := w.handler(job.Type)
	if handler == nil {
		// In a rolling deploy new types reach old workers first: hand the job back for a
		// worker that knows it instead of failing work nobody here can do.
		w.logf("worker %s: no handler for job %d of type %q (this worker handles: %s); releasing it for %s",
			w.cfg.WorkerID, job.ID, job.Type, w.jobTypes(), w.cfg.UnknownTypeDelay)
		rs.keeper.mu.Lock()
		h.done = true
		rs.keeper.mu.Unlock()
		next = w.claimNext(rs)
		claimed := rs.keeper.release(h, w.cfg.UnknownTypeDelay, nil, next)
		w.take(rs, claimed, reservedBy(next))
		return
	}
	result, err := call(h.ctx, handler, h.jc)
	if err == nil {
		if encoded, ok := rs.keeper.completable(h, result); ok {
			shared = true
			w.completeShared(rs, h, encoded)
			return
		}
	}
	next = w.claimNext(rs)
	claimed := rs.keeper.settle(h, result, err, next)
	w.take(rs, claimed, reservedBy(next))
}

// finish ends the worker's hold on settled (or given up) jobs: their slots are free, the claim
// loop is woken and Run stops waiting for them. handedOver: a claim rode on their settle call,
// which counted their slots as free while it was in flight.
func (w *Worker) finish(rs *workerRun, jobs []*heldJob, handedOver bool) {
	rs.keeper.drop(jobs)
	w.mu.Lock()
	rs.holding -= len(jobs)
	if handedOver {
		rs.handingOver -= len(jobs)
	}
	w.mu.Unlock()
	select { // wake the claim loop
	case rs.slotFree <- struct{}{}:
	default:
	}
	for _, h := range jobs {
		close(h.finished)
	}
	rs.wg.Add(-len(jobs))
}

func reservedBy(next *ClaimParams) int {
	if next == nil {
		return 0
	}
	return next.MaxJobs
}

// call runs a handler, turning a panic into a *PanicError carrying the goroutine's stack.
func call(ctx context.Context, h Handler, jc *JobContext) (result any, err error) {
	defer func() {
		if v := recover(); v != nil {
			result, err = nil, newPanicError(v, debug.Stack())
		}
	}()
	return h.Work(ctx, jc)
}
