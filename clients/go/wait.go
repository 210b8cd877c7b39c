package jobq

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

const (
	// An unfinished job answered well before the wait asked for (an instance shutting down,
	// say): pause before asking again, so the loop never spins.
	earlyAnswerPauseFirst = 100 * time.Millisecond
	earlyAnswerPauseMax   = time.Second
)

// Wait waits until the job is finished (succeeded, dead or cancelled) and answers it; a dead
// or cancelled job is answered like a succeeded one, so look at its Status (and Result,
// LastError).
//
// It long-polls GET /v1/jobs/{id}?wait_seconds= in rounds of at most 20 s (the service's
// limit), which the service answers the moment the job finishes, holding no database
// connection meanwhile. When timeout passes first it returns a *WaitTimeoutError carrying the
// job as last seen: the job goes on, and waiting again is fine. Transient failures are retried
// with a backoff within timeout; other error answers are returned (a 404 *Error when the job
// does not exist). ctx cancels the wait.
func (c *Client) Wait(ctx context.Context, id int64, timeout time.Duration) (*Job, error) {
	if timeout < 0 {
		return nil, fmt.Errorf("jobq: negative wait timeout %s", timeout)
	}
	deadline := time.Now().Add(timeout)
	var last *Job
	var failures backoff
	pause := earlyAnswerPauseFirst
	for {
		round := time.Until(deadline)
		if round > maxPollWait {
			round = maxPollWait
		}
		if round < 0 {
			round = 0
		}
		round = round.Truncate(time.Millisecond)
		asked := time.Now()
		job, err := c.poll(ctx, id, round)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if !isTransient(err) {
				return nil, err
			}
			delay := retryDelay(err, &failures)
			if time.Now().Add(delay).After(deadline) {
				return nil, &WaitTimeoutError{JobID: id, Timeout: timeout, Job: last, Cause: err}
			}
			if err := sleep(ctx, delay); err != nil {
				return nil, err
			}
			continue
		}
		failures.Reset()
		last = job
		if job.Finished() {
			return job, nil
		}
		now := time.Now()
		if !now.Before(deadline) {
			return nil, &WaitTimeoutError{JobID: id, Timeout: timeout, Job: last}
		}
		if now.Sub(asked) < round*9/10 {
			d := pause
			if rest := deadline.Sub(now); rest < d {
				d = rest
			}
			if err := sleep(ctx, d); err != nil {
				return nil, err
			}
			if pause *= 2; pause > earlyAnswerPauseMax {
				pause = earlyAnswerPauseMax
			}
		} else {
			pause = earlyAnswerPauseFirst
		}
	}
}

// poll is one long-polling read of a job; Wait repeats it itself.
func (c *Client) poll(ctx context.Context, id int64, wait time.Duration) (*Job, error) {
	query := url.Values{"wait_seconds": {strconv.FormatFloat(wait.Seconds(), 'f', 3, 64)}}
	r := request{method: http.MethodGet, path: jobPath(id, ""), query: query, resend: true, noRetry: true, poll: wait}
	var job Job
	if err := c.do(ctx, r, &job); err != nil {
		return nil, err
	}
	return &job, nil
}

// EnqueueAndWait enqueues one job (as Enqueue) and waits for it to finish (as Wait); timeout
// covers the wait. On a *WaitTimeoutError the job stays enqueued (its id is in the error);
// with an IdempotencyKey, calling again waits for the same job instead of adding one.
func (c *Client) EnqueueAndWait(ctx context.Context, params EnqueueParams, timeout time.Duration) (*Job, error) {
	job, err := c.Enqueue(ctx, params)
	if err != nil {
		return nil, err
	}
	if job.Finished() { // an idempotent repeat of a job that finished already
		return job, nil
	}
	return c.Wait(ctx, job.ID, timeout)
}

// -- workflows ------------------------------------------------------------------------------

// CreateWorkflow creates a workflow: every step's job in one transaction. Steps without After
// are due at once; each other one waits until its parents end. A cycle, a duplicate or an
// unknown step name is a 422 *Error and creates nothing. It sends an idempotency key of its
// own, so a request sent again after a broken connection creates one workflow (see
// CreateWorkflowWithKey for a key of the caller's).
func (c *Client) CreateWorkflow(ctx context.Context, name string, steps []Step) (*Workflow, error) {
	return c.CreateWorkflowWithKey(ctx, name, "", steps)
}

// CreateWorkflowWithKey is CreateWorkflow under the caller's idempotency key ("": one of its
// own). The key stands for the workflow it made: the same key with the same request answers
// that workflow again, with another request a 422 *Error.
func (c *Client) CreateWorkflowWithKey(ctx context.Context, name, idempotencyKey string, steps []Step) (*Workflow, error) {
	type stepBody struct {
		enqueueBody
		Name  string   `json:"name"`
		After []string `json:"after"`
	}
	if idempotencyKey == "" {
		idempotencyKey = newIdempotencyKey()
	}
	body := struct {
		Name           string     `json:"name"`
		Steps          []stepBody `json:"steps"`
		IdempotencyKey string     `json:"idempotency_key"`
	}{Name: name, Steps: make([]stepBody, len(steps)), IdempotencyKey: idempotencyKey}
	for i := range steps {
		item, err := steps[i].body()
		if err != nil {
			return nil, fmt.Errorf("jobq: step %q: %w", steps[i].Name, err)
		}
		after := steps[i].After
		if after == nil {
			after = []string{}
		}
		body.Steps[i] = stepBody{item, steps[i].Name, after}
	}
	var wf Workflow
	post := request{method: http.MethodPost, path: "/v1/workflows", body: body, resend: true}
	if err := c.do(ctx, post, &wf); err != nil {
		return nil, err
	}
	return &wf, nil
}

// GetWorkflow answers a workflow with each step's job as it is now.
func (c *Client) GetWorkflow(ctx context.Context, id int64) (*Workflow, error) {
	var wf Workflow
	if err := c.do(ctx, request{method: http.MethodGet, path: workflowPath(id, ""), resend: true}, &wf); err != nil {
		return nil, err
	}
	return &wf, nil
}

// CancelWorkflow cancels every open step of a workflow.
func (c *Client) CancelWorkflow(ctx context.Context, id int64) (*WorkflowChange, error) {
	var change WorkflowChange
	if err := c.do(ctx, request{method: http.MethodPost, path: workflowPath(id, "/cancel")}, &change); err != nil {
		return nil, err
	}
	return &change, nil
}

// RetryWorkflow puts every dead or cancelled step back, so the graph resumes where it failed.
func (c *Client) RetryWorkflow(ctx context.Context, id int64) (*WorkflowChange, error) {
	var change WorkflowChange
	if err := c.do(ctx, request{method: http.MethodPost, path: workflowPath(id, "/retry")}, &change); err != nil {
		return nil, err
	}
	return &change, nil
}

// WaitWorkflow waits until the workflow is no longer running and answers it (look at State).
//
// It reads the workflow, then long-polls (as Wait) the job of its last open step, and reads
// the workflow again once that job finished, until every step ended: a chain of steps is one
// long-poll, not a loop of reads. When timeout passes first it returns a
// *WorkflowWaitTimeoutError carrying the workflow as last seen.
func (c *Client) WaitWorkflow(ctx context.Context, id int64, timeout time.Duration) (*Workflow, error) {
	deadline := time.Now().Add(timeout)
	var last *Workflow
	var failures backoff
	for {
		wf, err := c.GetWorkflow(ctx, id)
		if err != nil {
			if ctx.Err() != nil || !isTransient(err) {
				return nil, err
			}
			delay := retryDelay(err, &failures)
			if time.Now().Add(delay).After(deadline) {
				return nil, &WorkflowWaitTimeoutError{WorkflowID: id, Timeout: timeout, Workflow: last, Cause: err}
			}
			if err := sleep(ctx, delay); err != nil {
				return nil, err
			}
			continue
		}
		failures.Reset()
		last = wf
		if wf.Finished() {
			return wf, nil
		}
		rest := time.Until(deadline)
		if rest <= 0 {
			return nil, &WorkflowWaitTimeoutError{WorkflowID: id, Timeout: timeout, Workflow: wf}
		}
		open := openStepJob(wf)
		if open == 0 { // every step ended between two reads: read again
			continue
		}
		_, err = c.Wait(ctx, open, rest)
		var apiErr *Error
		switch {
		case errors.Is(err, ErrWaitTimeout):
			return nil, &WorkflowWaitTimeoutError{WorkflowID: id, Timeout: timeout, Workflow: wf}
		case errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound:
			// The step's job was deleted: the next read of the workflow tells.
		case err != nil:
			return nil, err
		}
	}
}

// openStepJob is the job id of the last step still open, 0 when none: the last in creation
// order is the deepest, so waiting for it usually waits out the others.
func openStepJob(wf *Workflow) int64 {
	for i := len(wf.Steps) - 1; i >= 0; i-- {
		if job := wf.Steps[i].Job; job != nil && !job.Finished() {
			return job.ID
		}
	}
	return 0
}

func workflowPath(id int64, suffix string) string {
	return "/v1/workflows/" + strconv.FormatInt(id, 10) + suffix
}
