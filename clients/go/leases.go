package jobq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// The lease keeper: the leases a worker holds, their batched heartbeats, checkpoint saves and
// settling.
//
//   - Heartbeats: every interval one POST /v1/heartbeat carries every held lease (split only
//     past the service's per-call limit). An item answered ok: false (lease lost, the job
//     cancelled or past its timeout) marks the job lost and cancels its handler's context; a
//     lost job is left out of later heartbeats and never completed, failed or released.
//   - Checkpoints: JobContext.SaveCheckpoint is one heartbeat for that lease carrying the
//     checkpoint, so it is stored only while the lease is held.
//   - Settling: once a handler has returned, settle completes, fails or releases its job (or
//     completeMany completes it with others, see completes.go), retrying transient errors for
//     a while. Only ok in an answer decides anything, item by item. The call may claim the
//     worker's next jobs too (claim_next): only its first try carries the claim (a repeat
//     could lease jobs twice whose first answer was lost), and an error answer to it is sent
//     again without, so the job is settled whatever the claim met.

const (
	maxLeasesPerCall = 1000             // the service's limit of lease items per call
	settleRetryFor   = 10 * time.Second // how long complete / fail / release are retried
	// After a failed heartbeat the next comes this soon (or at the interval, if sooner).
	heartbeatRetryAfter = time.Second
)

// heldJob is one job a worker holds: its lease, its handler's context and what became of it.
type heldJob struct {
	ref    LeaseRef
	jc     *JobContext
	ctx    context.Context // the handler's; cancelled when the job is aborted
	cancel context.CancelFunc
	// finished is closed once the job's supervisor is through (settled or given up).
	finished chan struct{}
	saveMu   sync.Mutex // one checkpoint save at a time

	// Guarded by leaseKeeper.mu.
	lost              bool            // not held any more: never settle it
	done              bool            // the handler has returned
	releaseCheckpoint json.RawMessage // saved while stopping: the release hands it on
}

// leaseKeeper keeps a worker's leases for one Worker.Run.
type leaseKeeper struct {
	client       *Client
	workerID     string
	leaseSeconds int
	interval     time.Duration
	stopping     <-chan struct{} // closed when the worker begins to stop
	logf         func(format string, args ...any)

	mu               sync.Mutex
	held             map[LeaseRef]*heldJob
	claimNextRefused bool // the service refused a claim_next: settle without from now on
}

func newLeaseKeeper(w *Worker, stopping <-chan struct{}) *leaseKeeper {
	return &leaseKeeper{
		client:       w.client,
		workerID:     w.cfg.WorkerID,
		leaseSeconds: w.leaseSeconds,
		interval:     w.cfg.HeartbeatInterval,
		stopping:     stopping,
		logf:         w.logf,
		held:         make(map[LeaseRef]*heldJob),
	}
}

// hold starts keeping a just claimed job's lease; its handler's context derives from base.
func (k *leaseKeeper) hold(job *Job, base context.Context) *heldJob {
	h := &heldJob{ref: LeaseRef{JobID: job.ID, LeaseID: job.LeaseID}, finished: make(chan struct{})}
	h.ctx, h.cancel = context.WithCancel(base)
	h.jc = newJobContext(job, func(cp, pg json.RawMessage) error { return k.save(h, cp, pg) }, k.stopping)
	k.mu.Lock()
	k.held[h.ref] = h
	k.mu.Unlock()
	return h
}

// drop stops keeping the jobs' leases: they were settled, given up or handed back.
func (k *leaseKeeper) drop(jobs []*heldJob) {
	k.mu.Lock()
	for _, h := range jobs {
		if k.held[h.ref] == h {
			delete(k.held, h.ref)
		}
	}
	k.mu.Unlock()
	for _, h := range jobs {
		h.cancel() // releases the context's resources; the handler has returned
	}
}

// jobs answers the jobs held now.
func (k *leaseKeeper) jobs() []*heldJob {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]*heldJob, 0, len(k.held))
	for _, h := range k.held {
		out = append(out, h)
	}
	return out
}

// -- heartbeats -----------------------------------------------------------------------------

// runHeartbeats sends, every interval until ctx is done, one heartbeat carrying every lease
// still held.
func (k *leaseKeeper) runHeartbeats(ctx context.Context) {
	timer := time.NewTimer(k.interval)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		started := time.Now()
		var live []*heldJob
		for _, h := range k.jobs() {
			k.mu.Lock()
			lost := h.lost
			k.mu.Unlock()
			if !lost {
				live = append(live, h)
			}
		}
		answered := true
		for first := 0; first < len(live); first += maxLeasesPerCall {
			last := first + maxLeasesPerCall
			if last > len(live) {
				last = len(live)
			}
			answered = k.heartbeat(ctx, live[first:last]) && answered
		}
		// Keep the cadence whatever the request took; after a failure, try again sooner.
		next := k.interval
		if !answered && next > heartbeatRetryAfter {
			next = heartbeatRetryAfter
		}
		if next -= time.Since(started); next < 0 {
			next = 0
		}
		timer.Reset(next)
	}
}

// heartbeat sends one heartbeat for these leases; it answers whether the service answered.
func (k *leaseKeeper) heartbeat(ctx context.Context, held []*heldJob) bool {
	items := make([]HeartbeatItem, len(held))
	for i, h := range held {
		items[i] = HeartbeatItem{LeaseRef: h.ref, LeaseSeconds: k.leaseSeconds}
	}
	// A heartbeat still unanswered when the next is due is of no use: bound it, retries
	// included, by the interval.
	ctx, cancel := context.WithTimeout(ctx, k.interval)
	defer cancel()
	results, err := k.client.Heartbeat(ctx, k.workerID, items)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return true
		}
		if !isTransient(err) {
			k.logf("worker %s: heartbeat refused: %v", k.workerID, err)
			return true
		}
		k.logf("worker %s: heartbeat of %d leases failed (%v); retrying soon", k.workerID, len(items), err)
		return false
	}
	for i, r := range results {
		if i < len(held) && r.JobID == held[i].ref.JobID && !r.OK {
			k.lose(held[i], lossReason(r), "")
		}
	}
	return true
}

// lose acts on the service's word that a lease is gone: the handler's context is cancelled
// and the job will never be settled. A handler that has returned already is left alone: its
// settle call gets the verdict itself.
func (k *leaseKeeper) lose(h *heldJob, reason error, while string) {
	k.mu.Lock()
	if h.lost || h.done || k.held[h.ref] != h {
		k.mu.Unlock()
		return
	}
	h.lost = true
	h.jc.setAbort(reason) // before the cancel, so a handler seeing ctx.Done() can read it
	k.mu.Unlock()
	k.logf("worker %s: job %d: %v%s; cancelling its handler", k.workerID, h.ref.JobID, reason, while)
	h.cancel()
}

// lossReason says why a lease item was answered ok: false.
func lossReason(r LeaseResult) error {
	switch {
	case r.Cancelled:
		return ErrJobCancelled
	case r.TimedOut:
		return ErrJobTimedOut
	}
	return ErrLeaseLost
}

// -- checkpoints ----------------------------------------------------------------------------

// save is SaveCheckpoint's saver: one heartbeat for this lease carrying the checkpoint.
func (k *leaseKeeper) save(h *heldJob, cp, pg json.RawMessage) error {
	h.saveMu.Lock()
	defer h.saveMu.Unlock()
	k.mu.Lock()
	lost := h.lost
	k.mu.Unlock()
	if lost {
		if reason := h.jc.AbortReason(); reason != nil {
			return reason
		}
		return ErrLeaseLost
	}
	item := HeartbeatItem{LeaseRef: h.ref, LeaseSeconds: k.leaseSeconds, Checkpoint: cp, Progress: pg}
	// Not the handler's context: a save must work after the grace period cancelled it.
	results, err := k.client.Heartbeat(context.Background(), k.workerID, []HeartbeatItem{item})
	if err != nil {
		return fmt.Errorf("jobq: saving job %d's checkpoint: %w", h.ref.JobID, err)
	}
	if len(results) != 1 {
		return fmt.Errorf("jobq: saving job %d's checkpoint: %d results for 1 lease", h.ref.JobID, len(results))
	}
	if r := results[0]; !r.OK {
		reason := lossReason(r)
		k.lose(h, reason, " while saving its checkpoint")
		return reason
	}
	h.jc.recordSaved(cp, pg)
	select {
	case <-k.stopping:
		// Saved, so the release hands this checkpoint on and the next worker starts from it.
		k.mu.Lock()
		h.releaseCheckpoint = cp
		k.mu.Unlock()
		return ErrStopRequested
	default:
		return nil
	}
}

// -- settling -------------------------------------------------------------------------------

// settle completes, fails or releases the job according to how its handler returned, and
// answers the jobs next claimed with it (none when the job was given up).
func (k *leaseKeeper) settle(h *heldJob, result any, err error, next *ClaimParams) []*Job {
	k.mu.Lock()
	h.done = true
	lost := h.lost
	checkpoint := h.releaseCheckpoint
	k.mu.Unlock()
	abort := h.jc.AbortReason()
	switch {
	case lost:
		k.logf("worker %s: job %d given up (%v)", k.workerID, h.ref.JobID, abort)
		return nil
	case abort == ErrGraceExpired && err != nil:
		// Cut off by the end of the grace period: hand it back, keeping the last checkpoint.
		return k.release(h, 0, checkpoint, next)
	case err == nil:
		return k.complete(h, result, next)
	case errors.Is(err, ErrStopRequested):
		return k.release(h, 0, checkpoint, next)
	case errors.Is(err, ErrLeaseLost), errors.Is(err, ErrJobCancelled), errors.Is(err, ErrJobTimedOut):
		k.mu.Lock()
		h.lost = true
		k.mu.Unlock()
		k.logf("worker %s: job %d given up (%v)", k.workerID, h.ref.JobID, err)
		return nil
	}
	detail := errorDetail(err)
	k.logf("worker %s: job %d failed: %s: %s", k.workerID, h.ref.JobID, detail.Type, detail.Message)
	return k.fail(h, detail, !IsNonRetryable(err), retryAfterOf(err), next)
}

func retryAfterOf(err error) *float64 {
	var r *retryAfterError
	if !errors.As(err, &r) {
		return nil
	}
	seconds := r.delay.Seconds()
	return &seconds
}

func (k *leaseKeeper) complete(h *heldJob, result any, next *ClaimParams) []*Job {
	encoded, err := marshalValue(result)
	if err != nil {
		err = fmt.Errorf("the handler's result is not JSON: %w", err)
		return k.fail(h, errorDetail(err), false, nil, next)
	}
	item := CompleteItem{LeaseRef: h.ref, Result: encoded}
	return k.send(h, "complete", next, func(ctx context.Context, next *ClaimParams) (*SettleResults, error) {
		return k.client.Complete(ctx, k.workerID, []CompleteItem{item}, next)
	})
}

func (k *leaseKeeper) fail(h *heldJob, detail ErrorDetail, retryable bool, retryAfter *float64, next *ClaimParams) []*Job {
	item := FailItem{LeaseRef: h.ref, Error: detail, Retryable: retryable, RetryAfterSeconds: retryAfter}
	return k.send(h, "fail", next, func(ctx context.Context, next *ClaimParams) (*SettleResults, error) {
		return k.client.Fail(ctx, k.workerID, []FailItem{item}, next)
	})
}

// release hands the job back; a checkpoint given replaces the saved one (nil keeps it).
func (k *leaseKeeper) release(h *heldJob, delay time.Duration, checkpoint json.RawMessage, next *ClaimParams) []*Job {
	item := ReleaseItem{LeaseRef: h.ref, DelaySeconds: delay.Seconds(), Checkpoint: checkpoint}
	return k.send(h, "release", next, func(ctx context.Context, next *ClaimParams) (*SettleResults, error) {
		return k.client.Release(ctx, k.workerID, []ReleaseItem{item}, next)
	})
}

// send makes one settle call, retrying transient errors for settleRetryFor; it answers the
// jobs its claim took.
func (k *leaseKeeper) send(h *heldJob, op string, next *ClaimParams, call func(context.Context, *ClaimParams) (*SettleResults, error)) []*Job {
	// Not the run's context: settling must go through while the worker stops.
	ctx := context.Background()
	deadline := time.Now().Add(settleRetryFor)
	var b backoff
	var answer *SettleResults
	for {
		ask := next
		next = nil // only the first try claims: the claim loop covers the slot afterwards
		var err error
		answer, err = call(ctx, ask)
		if err == nil {
			break
		}
		var apiErr *Error
		refused := errors.As(err, &apiErr) && !apiErr.Transient()
		switch {
		case ask != nil && refused:
			k.claimNextFailed(apiErr)
			continue // the settle on its own, whatever the claim was refused for
		case isTransient(err) && time.Now().Before(deadline):
			delay := retryDelay(err, &b)
			k.logf("worker %s: %s of job %d failed (%v); retrying in %s", k.workerID, op, h.ref.JobID, err, delay.Round(time.Millisecond))
			_ = sleep(ctx, delay)
			continue
		case op == "complete" && refused:
			// The service will not take this result (too large, say): fail the job for good.
			op = "fail"
			item := FailItem{LeaseRef: h.ref, Error: errorDetail(fmt.Errorf("complete refused: %w", err))}
			call = func(ctx context.Context, next *ClaimParams) (*SettleResults, error) {
				return k.client.Fail(ctx, k.workerID, []FailItem{item}, next)
			}
			continue
		}
		k.logf("worker %s: %s of job %d failed: %v; it returns to the queue when its lease expires", k.workerID, op, h.ref.JobID, err)
		return nil
	}
	if len(answer.Results) == 1 && !answer.Results[0].OK {
		k.logf("worker %s: %s of job %d refused: %v", k.workerID, op, h.ref.JobID, lossReason(answer.Results[0]))
	}
	if answer.ClaimError != nil {
		k.logf("worker %s: the claim after %s of job %d failed: %v", k.workerID, op, h.ref.JobID, answer.ClaimError)
	}
	return answer.Claimed
}

// claimNextFailed notes a settle whose claim_next was refused; when the service names the
// field (one from before claim_next, say), none is sent any more.
func (k *leaseKeeper) claimNextFailed(err *Error) {
	for _, f := range err.Errors {
		if strings.HasPrefix(f.Field, "body.claim_next") {
			k.mu.Lock()
			first := !k.claimNextRefused
			k.claimNextRefused = true
			k.mu.Unlock()
			if first {
				k.logf("worker %s: the service refuses claim_next (%v); claiming on its own", k.workerID, err)
			}
			return
		}
	}
}

func (k *leaseKeeper) refusesClaimNext() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.claimNextRefused
}

// -- stopping -------------------------------------------------------------------------------

// abortRunning cancels the contexts of the handlers still running, for reason.
func (k *leaseKeeper) abortRunning(reason error) int {
	n := 0
	for _, h := range k.jobs() {
		k.mu.Lock()
		running := !h.done && !h.lost
		k.mu.Unlock()
		if running {
			h.jc.setAbort(reason)
			h.cancel()
			n++
		}
	}
	return n
}

// abandonRunning gives up the jobs whose handlers still run (they ignored their cancelled
// context): they will never be settled by their handlers, and are answered for release.
func (k *leaseKeeper) abandonRunning() []*heldJob {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []*heldJob
	for _, h := range k.held {
		if !h.done && !h.lost {
			h.lost = true
			out = append(out, h)
		}
	}
	return out
}
