package jobq

import (
	"encoding/json"
	"sync"
)

// JobContext is what a handler receives besides its context.Context: the claimed job, its
// last checkpoint, and the worker's two signals to it.
//
// The handler's context.Context is cancelled when the job is aborted: its lease was lost,
// the job was cancelled or ran past its timeout, or the worker's shutdown grace period ended
// (AbortReason says which). Stopping reports the worker's graceful stop, which does not
// cancel the context: a handler then saves a checkpoint (SaveCheckpoint answers
// ErrStopRequested) and returns, and its job is handed back.
type JobContext struct {
	// Job is the job as claimed: ID (stable across attempts: use it to make side effects
	// idempotent), Type, Payload, Attempt, the Checkpoint it carried, Parents.
	Job *Job

	// save stores a checkpoint under the lease; nil outside a worker.
	save     func(state, progress json.RawMessage) error
	stopping <-chan struct{}

	mu         sync.Mutex
	checkpoint json.RawMessage
	progress   json.RawMessage
	abort      error
}

// NewJobContext answers a context for job outside a worker, for a handler's own unit tests:
// SaveCheckpoint only records the checkpoint, and Stopping never reports a stop.
func NewJobContext(job *Job) *JobContext {
	return newJobContext(job, nil, nil)
}

func newJobContext(job *Job, save func(state, progress json.RawMessage) error, stopping <-chan struct{}) *JobContext {
	if stopping == nil {
		stopping = make(chan struct{})
	}
	return &JobContext{
		Job:        job,
		save:       save,
		stopping:   stopping,
		checkpoint: job.Checkpoint,
		progress:   job.Progress,
	}
}

// DecodePayload unmarshals the job's payload into v.
func (jc *JobContext) DecodePayload(v any) error { return jc.Job.DecodePayload(v) }

// Checkpoint answers the job's checkpoint: the last one this handler saved, else the one the
// job was claimed with (nil when none).
func (jc *JobContext) Checkpoint() json.RawMessage {
	jc.mu.Lock()
	defer jc.mu.Unlock()
	return jc.checkpoint
}

// DecodeCheckpoint unmarshals Checkpoint into v; it answers false, leaving v alone, when
// there is none.
func (jc *JobContext) DecodeCheckpoint(v any) (bool, error) {
	cp := jc.Checkpoint()
	if len(cp) == 0 {
		return false, nil
	}
	return true, json.Unmarshal(cp, v)
}

// Progress answers the job's progress as last saved (nil when none).
func (jc *JobContext) Progress() json.RawMessage {
	jc.mu.Lock()
	defer jc.mu.Unlock()
	return jc.progress
}

// SaveCheckpoint saves state (any JSON value) as the job's checkpoint now, with progress
// (any JSON value, e.g. {"done": 8, "total": 20}; nil leaves it as it is), in one heartbeat
// that checks the lease is still held. The job's next attempt (after a crash, a lost lease or
// a release) receives it as its Checkpoint.
//
// It answers ErrLeaseLost, ErrJobCancelled or ErrJobTimedOut (the handler's context is
// cancelled too) when the lease is no longer held, and ErrStopRequested after saving once the
// worker is stopping: return it, and the job is released with this checkpoint so the next
// worker resumes at once. It takes no context on purpose: it works after the grace period has
// cancelled the handler's context, to save the last state on the way out (bounded by the
// client's request timeout).
func (jc *JobContext) SaveCheckpoint(state, progress any) error {
	cp, err := marshalValue(state)
	if err != nil {
		return err
	}
	var pg json.RawMessage
	if progress != nil {
		if pg, err = marshalValue(progress); err != nil {
			return err
		}
	}
	if jc.save != nil {
		// The saver records the state here itself, once the service has it.
		return jc.save(cp, pg)
	}
	jc.recordSaved(cp, pg)
	return nil
}

func (jc *JobContext) recordSaved(cp, pg json.RawMessage) {
	jc.mu.Lock()
	defer jc.mu.Unlock()
	jc.checkpoint = cp
	if pg != nil {
		jc.progress = pg
	}
}

// Stopping answers a channel closed once the worker begins a graceful stop.
func (jc *JobContext) Stopping() <-chan struct{} { return jc.stopping }

// IsStopping reports whether the worker is stopping: save a checkpoint and return soon.
func (jc *JobContext) IsStopping() bool {
	select {
	case <-jc.stopping:
		return true
	default:
		return false
	}
}

// AbortReason answers why the worker cancelled the handler's context (ErrLeaseLost,
// ErrJobCancelled, ErrJobTimedOut or ErrGraceExpired), nil while it has not. After a lost
// lease, cancellation or timeout the worker never completes, fails or releases the job.
func (jc *JobContext) AbortReason() error {
	jc.mu.Lock()
	defer jc.mu.Unlock()
	return jc.abort
}

// setAbort records why the handler's context is about to be cancelled (the first reason
// stands).
func (jc *JobContext) setAbort(reason error) {
	jc.mu.Lock()
	defer jc.mu.Unlock()
	if jc.abort == nil {
		jc.abort = reason
	}
}
