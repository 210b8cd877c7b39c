package jobq

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Sentinel errors. Compare with errors.Is.
var (
	// ErrLeaseLost: the worker no longer holds the job's lease (the reaper took it back after
	// it expired, or another worker holds it now). Work done past this point may be done twice.
	ErrLeaseLost = errors.New("jobq: lease lost")
	// ErrJobCancelled: the job was cancelled (by an operator, or its workflow) while it ran.
	ErrJobCancelled = errors.New("jobq: job cancelled")
	// ErrJobTimedOut: the attempt ran past the job's timeout_seconds.
	ErrJobTimedOut = errors.New("jobq: job ran past its timeout_seconds")
	// ErrStopRequested is returned by JobContext.SaveCheckpoint, after saving, once the worker
	// is stopping. A handler that returns it (or an error wrapping it) has its job released,
	// without charging the attempt, with the checkpoint it saved, so the next worker resumes.
	ErrStopRequested = errors.New("jobq: worker stopping, job handed back")
	// ErrGraceExpired is a JobContext's AbortReason when the worker's shutdown grace period
	// ended before the handler did; the job is released with its last saved checkpoint.
	ErrGraceExpired = errors.New("jobq: shutdown grace period over")
	// ErrWaitTimeout matches every *WaitTimeoutError and *WorkflowWaitTimeoutError.
	ErrWaitTimeout = errors.New("jobq: wait timed out")
)

// Error is an error answer (4xx or 5xx) of the service, carrying its RFC 9457 problem details.
type Error struct {
	Status int          // the HTTP status
	Type   string       // the problem's type URI
	Title  string       // the problem's title, e.g. "Forbidden"
	Detail string       // the problem's detail, e.g. "this key lacks the enqueue scope"
	Errors []FieldError // the fields at fault (422), if any
	// Problem is the problem+json body as the service sent it; for an answer whose body was
	// not a JSON object (a proxy's HTML page, say), one made up from the status and the text.
	Problem json.RawMessage
	// RetryAfter is the answer's Retry-After header (429, 503), zero without one.
	RetryAfter time.Duration
}

// FieldError names one field of a refused request and what is wrong with it.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "jobq: %d", e.Status)
	title := e.Title
	if title == "" {
		title = http.StatusText(e.Status)
	}
	if title != "" {
		b.WriteString(" " + title)
	}
	if e.Detail != "" {
		b.WriteString(": " + e.Detail)
	}
	if len(e.Errors) > 0 {
		parts := make([]string, len(e.Errors))
		for i, f := range e.Errors {
			parts[i] = f.Field + ": " + f.Message
		}
		b.WriteString(" [" + strings.Join(parts, "; ") + "]")
	}
	return b.String()
}

// Transient reports whether sending the same request later may succeed (408, 429, 5xx).
func (e *Error) Transient() bool {
	return e.Status >= 500 || e.Status == http.StatusRequestTimeout || e.Status == http.StatusTooManyRequests
}

// newError builds the *Error of an error answer from its status, headers and body.
func newError(status int, header http.Header, body []byte) *Error {
	e := &Error{Status: status, RetryAfter: parseRetryAfter(header.Get("Retry-After"))}
	var problem struct {
		Type   string       `json:"type"`
		Title  string       `json:"title"`
		Detail string       `json:"detail"`
		Errors []FieldError `json:"errors"`
	}
	trimmed := strings.TrimSpace(string(body))
	if strings.HasPrefix(trimmed, "{") && json.Unmarshal(body, &problem) == nil {
		e.Type, e.Title, e.Detail, e.Errors = problem.Type, problem.Title, problem.Detail, problem.Errors
		e.Problem = json.RawMessage(trimmed)
		return e
	}
	if len(trimmed) > 1000 {
		trimmed = trimmed[:1000]
	}
	e.Title, e.Detail = http.StatusText(status), trimmed
	e.Problem, _ = json.Marshal(map[string]any{"status": status, "title": e.Title, "detail": e.Detail})
	return e
}

// parseRetryAfter reads a Retry-After header: delay seconds or an HTTP date.
func parseRetryAfter(value string) time.Duration {
	if value == "" {
		return 0
	}
	var seconds float64
	if _, err := fmt.Sscanf(value, "%g", &seconds); err == nil && seconds >= 0 {
		return time.Duration(seconds * float64(time.Second))
	}
	if at, err := http.ParseTime(value); err == nil {
		if d := time.Until(at); d > 0 {
			return d
		}
	}
	return 0
}

// WaitTimeoutError says a job did not finish within the time Client.Wait was given. The job
// goes on; waiting again is fine. errors.Is(err, ErrWaitTimeout) is true.
type WaitTimeoutError struct {
	JobID   int64
	Timeout time.Duration
	// Job is the job as the service last answered it (unfinished), nil when no answer came
	// at all (every try failed with a transient error; the last one is Cause).
	Job   *Job
	Cause error
}

func (e *WaitTimeoutError) Error() string {
	state := "no answer"
	if e.Job != nil {
		state = "still " + string(e.Job.Status)
	}
	return fmt.Sprintf("jobq: job %d not finished after %s (%s)", e.JobID, e.Timeout, state)
}

// Is makes errors.Is(err, ErrWaitTimeout) true.
func (e *WaitTimeoutError) Is(target error) bool { return target == ErrWaitTimeout }

// Unwrap answers the transient error of the last try, if that is why no answer came.
func (e *WaitTimeoutError) Unwrap() error { return e.Cause }

// WorkflowWaitTimeoutError says a workflow did not finish within the time
// Client.WaitWorkflow was given. errors.Is(err, ErrWaitTimeout) is true.
type WorkflowWaitTimeoutError struct {
	WorkflowID int64
	Timeout    time.Duration
	Workflow   *Workflow // as last answered (state running), nil when no answer came
	Cause      error
}

func (e *WorkflowWaitTimeoutError) Error() string {
	state := "no answer"
	if e.Workflow != nil {
		state = "still " + e.Workflow.State
	}
	return fmt.Sprintf("jobq: workflow %d not finished after %s (%s)", e.WorkflowID, e.Timeout, state)
}

// Is makes errors.Is(err, ErrWaitTimeout) true.
func (e *WorkflowWaitTimeoutError) Is(target error) bool { return target == ErrWaitTimeout }

// Unwrap answers the transient error of the last try, if that is why no answer came.
func (e *WorkflowWaitTimeoutError) Unwrap() error { return e.Cause }

// NonRetryable marks a handler's error as final: the job goes to dead at once instead of
// being retried after a backoff. It answers nil for nil.
func NonRetryable(err error) error {
	if err == nil {
		return nil
	}
	return &nonRetryableError{err}
}

type nonRetryableError struct{ err error }

func (e *nonRetryableError) Error() string { return e.err.Error() }
func (e *nonRetryableError) Unwrap() error { return e.err }

// IsNonRetryable reports whether err, or an error it wraps, was marked with NonRetryable.
func IsNonRetryable(err error) bool {
	var n *nonRetryableError
	return errors.As(err, &n)
}

// RetryAfter has a handler's failed attempt retried after exactly d (zero: at once) instead
// of the service's exponential backoff. It answers nil for nil.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	if d < 0 {
		d = 0
	}
	return &retryAfterError{err, d}
}

type retryAfterError struct {
	err   error
	delay time.Duration
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }
