package jobq

import (
	"context"
	"encoding/json"
	"net/http"
	"time"
)

// The raw worker protocol: claim, heartbeat, complete, fail and release. Worker is built on
// these; call them directly only to write a worker of your own.

// ClaimParams says what to claim.
type ClaimParams struct {
	Queues  []string
	MaxJobs int           // 1 to 100 (default 1)
	Lease   time.Duration // whole seconds; zero: each job's own lease_seconds
	Wait    time.Duration // long-poll up to this long (at most 20 s) when nothing is due
}

type claimBody struct {
	WorkerID     string   `json:"worker_id,omitempty"`
	Queues       []string `json:"queues"`
	MaxJobs      int      `json:"max_jobs,omitempty"`
	LeaseSeconds int      `json:"lease_seconds,omitempty"`
	WaitSeconds  float64  `json:"wait_seconds"`
}

func (p *ClaimParams) body(workerID string) claimBody {
	return claimBody{
		WorkerID:     workerID,
		Queues:       p.Queues,
		MaxJobs:      p.MaxJobs,
		LeaseSeconds: wholeSeconds(p.Lease),
		WaitSeconds:  p.Wait.Seconds(),
	}
}

// LeaseRef names one lease: the job and the lease it is held under.
type LeaseRef struct {
	JobID   int64  `json:"job_id"`
	LeaseID string `json:"lease_id"`
}

// HeartbeatItem extends one lease, saving a checkpoint and progress with it when set.
type HeartbeatItem struct {
	LeaseRef
	LeaseSeconds int             `json:"lease_seconds,omitempty"`
	Checkpoint   json.RawMessage `json:"checkpoint,omitempty"`
	Progress     json.RawMessage `json:"progress,omitempty"`
}

// CompleteItem completes one held job.
type CompleteItem struct {
	LeaseRef
	Result json.RawMessage `json:"result,omitempty"`
}

// FailItem fails one held job's attempt: retried after a backoff (or RetryAfterSeconds),
// or dead when not Retryable or out of attempts.
type FailItem struct {
	LeaseRef
	Error             ErrorDetail `json:"error"`
	Retryable         bool        `json:"retryable"`
	RetryAfterSeconds *float64    `json:"retry_after_seconds,omitempty"`
}

// ReleaseItem hands one held job back without charging the attempt.
type ReleaseItem struct {
	LeaseRef
	DelaySeconds float64         `json:"delay_seconds,omitempty"`
	Checkpoint   json.RawMessage `json:"checkpoint,omitempty"` // replaces the saved one
}

// LeaseResult is the service's verdict on one lease item: held and done (OK), or not held
// any more (Error "lease_lost"; Cancelled / TimedOut say why when that is the reason).
type LeaseResult struct {
	JobID          int64      `json:"job_id"`
	OK             bool       `json:"ok"`
	Status         Status     `json:"status"`
	Error          string     `json:"error"`
	Cancelled      bool       `json:"cancelled"`
	TimedOut       bool       `json:"timed_out"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at"`
}

// SettleResults answers a complete, fail or release: one result per item, in order, and,
// when the call carried a claim, the jobs it leased (ClaimError: the claim failed after the
// transition was done; the results stand).
type SettleResults struct {
	Results    []LeaseResult
	Claimed    []*Job
	ClaimError *Error
}

// Claim leases up to p.MaxJobs due jobs to workerID, long-polling up to p.Wait when none is
// due; an empty answer is normal. Never sent again after a broken connection: the first
// request may have leased jobs whose answer was lost (they return when their leases expire).
func (c *Client) Claim(ctx context.Context, workerID string, p ClaimParams) ([]*Job, error) {
	var answer struct {
		Jobs []*Job `json:"jobs"`
	}
	r := request{method: http.MethodPost, path: "/v1/claim", body: p.body(workerID), poll: p.Wait}
	if err := c.do(ctx, r, &answer); err != nil {
		return nil, err
	}
	return answer.Jobs, nil
}

// Heartbeat extends held leases, saving any checkpoint and progress; one result per item.
// A result that is not OK means the worker must stop working on that job.
func (c *Client) Heartbeat(ctx context.Context, workerID string, items []HeartbeatItem) ([]LeaseResult, error) {
	answer, err := c.leaseCall(ctx, "/v1/heartbeat", workerID, items, nil)
	if err != nil {
		return nil, err
	}
	return answer.Results, nil
}

// Complete completes held jobs. next, when not nil, claims the worker's next jobs in the same
// request (Claimed in the answer), so a busy worker makes one request per job.
func (c *Client) Complete(ctx context.Context, workerID string, items []CompleteItem, next *ClaimParams) (*SettleResults, error) {
	return c.leaseCall(ctx, "/v1/complete", workerID, items, next)
}

// Fail fails the attempts of held jobs; next as for Complete.
func (c *Client) Fail(ctx context.Context, workerID string, items []FailItem, next *ClaimParams) (*SettleResults, error) {
	return c.leaseCall(ctx, "/v1/fail", workerID, items, next)
}

// Release hands held jobs back to the queue without charging their attempts; next as for
// Complete.
func (c *Client) Release(ctx context.Context, workerID string, items []ReleaseItem, next *ClaimParams) (*SettleResults, error) {
	return c.leaseCall(ctx, "/v1/release", workerID, items, next)
}

func (c *Client) leaseCall(ctx context.Context, path, workerID string, items any, next *ClaimParams) (*SettleResults, error) {
	body := struct {
		WorkerID  string     `json:"worker_id"`
		Leases    any        `json:"leases"`
		ClaimNext *claimBody `json:"claim_next,omitempty"`
	}{WorkerID: workerID, Leases: items}
	// The same transition sent twice under the same lease is answered as a replay, and a
	// second heartbeat only extends the lease again: safe to repeat. Not with a claim riding
	// along, which, as any claim, is never sent twice.
	r := request{method: http.MethodPost, path: path, resend: next == nil}
	if next != nil {
		claim := next.body("")
		body.ClaimNext = &claim
		r.poll = next.Wait
	}
	r.body = body
	var answer struct {
		Results []LeaseResult `json:"results"`
		Claimed *struct {
			Jobs []*Job `json:"jobs"`
		} `json:"claimed"`
		ClaimError json.RawMessage `json:"claim_error"`
	}
	if err := c.do(ctx, r, &answer); err != nil {
		return nil, err
	}
	out := &SettleResults{Results: answer.Results}
	if answer.Claimed != nil {
		out.Claimed = answer.Claimed.Jobs
	}
	if problem := nullToNil(answer.ClaimError); problem != nil {
		var status struct {
			Status int `json:"status"`
		}
		_ = json.Unmarshal(problem, &status)
		if status.Status == 0 {
			status.Status = http.StatusInternalServerError
		}
		out.ClaimError = newError(status.Status, http.Header{}, problem)
	}
	return out, nil
}
