package jobq

import (
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// Status is a job's state.
type Status string

// The states of a job. A job is finished once succeeded, dead or cancelled.
const (
	StatusWaiting   Status = "waiting"   // waits for the jobs it depends on
	StatusScheduled Status = "scheduled" // due later (run_at, or a retry's backoff)
	StatusPending   Status = "pending"   // due: the next claim may take it
	StatusRunning   Status = "running"   // leased to a worker
	StatusSucceeded Status = "succeeded"
	StatusDead      Status = "dead" // failed for good
	StatusCancelled Status = "cancelled"
)

// Finished reports whether the status is final: succeeded, dead or cancelled.
func (s Status) Finished() bool {
	return s == StatusSucceeded || s == StatusDead || s == StatusCancelled
}

// Job is a job as the service answers it. JSON values (payload, result, checkpoint, progress,
// parents) are kept raw; a JSON null is kept as nil. Nullable scalars are their zero value
// when null.
type Job struct {
	ID          int64           `json:"id"`
	Queue       string          `json:"queue"`
	Type        string          `json:"type"`
	Status      Status          `json:"status"`
	Retrying    bool            `json:"retrying"` // scheduled again after a failed attempt
	Payload     json.RawMessage `json:"payload"`
	Priority    int             `json:"priority"`
	Attempts    int             `json:"attempts"`
	MaxAttempts int             `json:"max_attempts"`
	// Attempt is this try's number (1 on the first); set on claimed jobs only.
	Attempt         int             `json:"attempt,omitempty"`
	RunAt           time.Time       `json:"run_at"`
	LeaseSeconds    int             `json:"lease_seconds"`
	TimeoutSeconds  int             `json:"timeout_seconds,omitempty"`
	IdempotencyKey  string          `json:"idempotency_key,omitempty"`
	ConcurrencyKey  string          `json:"concurrency_key,omitempty"`
	OrderingKey     string          `json:"ordering_key,omitempty"`
	LeaseID         string          `json:"lease_id,omitempty"`
	WorkerID        string          `json:"worker_id,omitempty"`
	LeaseExpiresAt  *time.Time      `json:"lease_expires_at,omitempty"`
	Result          json.RawMessage `json:"result"`
	LastError       string          `json:"last_error,omitempty"`
	Errors          json.RawMessage `json:"errors,omitempty"` // the failures of past attempts
	Checkpoint      json.RawMessage `json:"checkpoint"`
	CheckpointAt    *time.Time      `json:"checkpoint_at,omitempty"`
	Progress        json.RawMessage `json:"progress"`
	ProgressAt      *time.Time      `json:"progress_at,omitempty"`
	CreatedAt       time.Time       `json:"created_at"`
	StartedAt       *time.Time      `json:"started_at,omitempty"`
	FinishedAt      *time.Time      `json:"finished_at,omitempty"`
	UpdatedAt       time.Time       `json:"updated_at"`
	Traceparent     string          `json:"traceparent,omitempty"`
	DependsOn       []int64         `json:"depends_on,omitempty"`
	OnParentFailure string          `json:"on_parent_failure,omitempty"`
	WorkflowID      int64           `json:"workflow_id,omitempty"`
	WorkflowStep    string          `json:"workflow_step,omitempty"`
	CallbackURL     string          `json:"callback_url,omitempty"`
	// Parents: for a claimed job that waited for others, how they ended ({"total",
	// "succeeded", "dead", "cancelled", "failed_ids", "jobs": [...]}). A parent in a queue the
	// worker's API key may not read comes with "result_hidden": true and its id and state only.
	Parents json.RawMessage `json:"parents,omitempty"`

	// Raw is the job's JSON exactly as the service answered it, fields this version of the
	// client does not know included.
	Raw json.RawMessage `json:"-"`
}

// UnmarshalJSON decodes a job, keeping the whole object in Raw.
func (j *Job) UnmarshalJSON(data []byte) error {
	type plain Job // without this method
	var p plain
	if err := json.Unmarshal(data, &p); err != nil {
		return err
	}
	*j = Job(p)
	for _, raw := range []*json.RawMessage{&j.Payload, &j.Result, &j.Checkpoint, &j.Progress, &j.Parents, &j.Errors} {
		*raw = nullToNil(*raw)
	}
	j.Raw = append(json.RawMessage(nil), data...)
	return nil
}

// Finished reports whether the job is succeeded, dead or cancelled.
func (j *Job) Finished() bool { return j.Status.Finished() }

// DecodePayload unmarshals the job's payload into v.
func (j *Job) DecodePayload(v any) error { return decodeRaw(j.Payload, v) }

// DecodeResult unmarshals the job's result into v.
func (j *Job) DecodeResult(v any) error { return decodeRaw(j.Result, v) }

func decodeRaw(raw json.RawMessage, v any) error {
	if len(raw) == 0 {
		raw = json.RawMessage("null")
	}
	return json.Unmarshal(raw, v)
}

func nullToNil(raw json.RawMessage) json.RawMessage {
	if string(raw) == "null" {
		return nil
	}
	return raw
}

// EnqueueParams describes one job to enqueue. Only Type is required; the zero value of every
// other field leaves the service's default.
type EnqueueParams struct {
	Type    string
	Payload any    // any value encoding/json takes; a json.RawMessage is sent as is
	Queue   string // default "default"
	// Priority: higher runs first (default 0).
	Priority int
	// Delay makes the job due this long after the database's now(); exclusive with RunAt.
	Delay time.Duration
	RunAt time.Time
	// MaxAttempts: tries before the job is dead (the service's default is 10).
	MaxAttempts int
	// Lease is the default lease of the job's claims (whole seconds, rounded up).
	Lease time.Duration
	// Timeout bounds one attempt's run time (whole seconds, rounded up).
	Timeout time.Duration
	// IdempotencyKey: a second enqueue with the same key on the same queue answers the job
	// the first created. Without one the client makes one per call, so that the call can be
	// sent again after a dropped connection without creating a second job.
	IdempotencyKey string
	// ConcurrencyKey groups jobs for the service's concurrency and rate limits.
	ConcurrencyKey string
	// DependsOn: the job waits until these jobs have ended (OnParentFailure: "cancel", the
	// default, or "run" says what a parent ending dead or cancelled does to it).
	DependsOn       []int64
	OnParentFailure string
	// OrderingKey: the queue's jobs with this key run one at a time, in enqueue order.
	OrderingKey string
	// CallbackURL receives the job's outcome, signed, when it finishes.
	CallbackURL string
}

// enqueueBody is EnqueueParams as POST /v1/jobs takes it.
type enqueueBody struct {
	Queue           string          `json:"queue"`
	Type            string          `json:"type"`
	Payload         json.RawMessage `json:"payload"`
	Priority        int             `json:"priority"`
	DelaySeconds    *float64        `json:"delay_seconds,omitempty"`
	RunAt           string          `json:"run_at,omitempty"`
	MaxAttempts     int             `json:"max_attempts,omitempty"`
	LeaseSeconds    int             `json:"lease_seconds,omitempty"`
	TimeoutSeconds  int             `json:"timeout_seconds,omitempty"`
	IdempotencyKey  string          `json:"idempotency_key,omitempty"`
	ConcurrencyKey  string          `json:"concurrency_key,omitempty"`
	DependsOn       []int64         `json:"depends_on,omitempty"`
	OnParentFailure string          `json:"on_parent_failure,omitempty"`
	OrderingKey     string          `json:"ordering_key,omitempty"`
	CallbackURL     string          `json:"callback_url,omitempty"`
}

func (p *EnqueueParams) body() (enqueueBody, error) {
	if p.Type == "" {
		return enqueueBody{}, fmt.Errorf("jobq: a job needs a Type")
	}
	payload, err := marshalValue(p.Payload)
	if err != nil {
		return enqueueBody{}, fmt.Errorf("jobq: payload of a %q job: %w", p.Type, err)
	}
	b := enqueueBody{
		Queue:           p.Queue,
		Type:            p.Type,
		Payload:         payload,
		Priority:        p.Priority,
		MaxAttempts:     p.MaxAttempts,
		LeaseSeconds:    wholeSeconds(p.Lease),
		TimeoutSeconds:  wholeSeconds(p.Timeout),
		IdempotencyKey:  p.IdempotencyKey,
		ConcurrencyKey:  p.ConcurrencyKey,
		DependsOn:       p.DependsOn,
		OnParentFailure: p.OnParentFailure,
		OrderingKey:     p.OrderingKey,
		CallbackURL:     p.CallbackURL,
	}
	if b.Queue == "" {
		b.Queue = "default"
	}
	if p.Delay > 0 {
		seconds := p.Delay.Seconds()
		b.DelaySeconds = &seconds
	}
	if !p.RunAt.IsZero() {
		b.RunAt = p.RunAt.Format(time.RFC3339Nano)
	}
	return b, nil
}

// marshalValue encodes a JSON value: nil is null, a json.RawMessage is taken as is.
func marshalValue(v any) (json.RawMessage, error) {
	switch v := v.(type) {
	case nil:
		return json.RawMessage("null"), nil
	case json.RawMessage:
		if len(v) == 0 {
			return json.RawMessage("null"), nil
		}
		if !json.Valid(v) {
			return nil, fmt.Errorf("invalid JSON")
		}
		return v, nil
	}
	return json.Marshal(v)
}

// wholeSeconds is d in whole seconds, rounded up (0 for 0).
func wholeSeconds(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	return int(math.Ceil(d.Seconds()))
}

// BatchCallback is a job enqueued with a batch that waits for all of it: due once every job
// succeeded (When "all_succeeded", the default; cancelled when one ends dead or cancelled) or
// ended at all ("all_finished"). Its handler reads the counts in the claimed job's Parents.
type BatchCallback struct {
	EnqueueParams
	When string
}

// Batch is what EnqueueBatch answers: the jobs in the order sent, and the callback job.
type Batch struct {
	Jobs     []*Job `json:"jobs"`
	Callback *Job   `json:"callback"`
}

// Workflow is a graph of jobs created at once (Client.CreateWorkflow).
type Workflow struct {
	ID        int64     `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by"`
	// State: running while any step is open; then succeeded (all did), failed (one ended
	// dead) or cancelled.
	State  string         `json:"state"`
	Counts map[string]int `json:"counts"` // steps per job state
	Steps  []WorkflowStep `json:"steps"`
}

// Finished reports whether every step has ended.
func (w *Workflow) Finished() bool { return w.State != "" && w.State != "running" }

// WorkflowStep is one step of a workflow and its job as it is now.
type WorkflowStep struct {
	Name  string   `json:"name"`
	After []string `json:"after"`
	Job   *Job     `json:"job"`
}

// Step is one step of a workflow to create: a job, its name, and the names of the steps it
// runs after (it is due once they all succeeded). IdempotencyKey, DependsOn and OrderingKey
// do not apply to steps.
type Step struct {
	Name  string
	After []string
	EnqueueParams
}

// WorkflowChange is what cancelling or retrying a workflow did.
type WorkflowChange struct {
	WorkflowID int64             `json:"workflow_id"`
	Changed    int               `json:"changed"` // steps moved
	Steps      map[string]string `json:"steps"`   // step name -> new state
}
