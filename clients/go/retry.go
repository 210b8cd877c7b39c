package jobq

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand"
	"net"
	"strings"
	"syscall"
	"time"
)

const (
	backoffFirst = 200 * time.Millisecond
	backoffCap   = 5 * time.Second
	// A Retry-After longer than this is not waited out inside one call: the error is returned.
	maxRetryAfter = 30 * time.Second
)

// backoff hands out exponential pauses between the tries of a failing call: each about twice
// the last, up to backoffCap, with jitter so that many workers failing at once (the service
// restarting) do not come back in step.
type backoff struct{ next time.Duration }

func (b *backoff) Next() time.Duration {
	if b.next == 0 {
		b.next = backoffFirst
	}
	d := b.next
	b.next *= 2
	if b.next > backoffCap {
		b.next = backoffCap
	}
	// Half fixed, half random: never less than half the nominal pause.
	return d/2 + time.Duration(rand.Int63n(int64(d/2)+1))
}

func (b *backoff) Reset() { b.next = 0 }

// isTransient reports whether a failed call is worth repeating: an error answer that may go
// away (5xx, 408, 429), no connection or a broken one, a timeout of the request itself, or an
// answer that was not the JSON it should be. A cancelled context is never transient.
func isTransient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var apiErr *Error
	if errors.As(err, &apiErr) {
		return apiErr.Transient()
	}
	var decodeErr *decodeError
	if errors.As(err, &decodeErr) {
		return true
	}
	var netErr net.Error // timeouts, and *net.OpError: refused, reset, unreachable
	if errors.As(err, &netErr) {
		return true
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	// net/http's unexported errServerClosedIdle: the keep-alive race on a request the
	// transport would not repeat on its own.
	return strings.Contains(err.Error(), "server closed idle connection")
}

// notSent reports whether a transport error happened before the request could reach the
// service (no connection could be opened), so even a request unsafe to repeat may go again.
func notSent(err error) bool {
	var opErr *net.OpError
	return errors.As(err, &opErr) && opErr.Op == "dial"
}

// decodeError is an answer whose body is not the JSON expected (cut off by a proxy, say).
type decodeError struct{ err error }

func (e *decodeError) Error() string { return "jobq: undecodable answer: " + e.err.Error() }
func (e *decodeError) Unwrap() error { return e.err }

func decodeJSON(body []byte, out any) error {
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(body, out); err != nil {
		return &decodeError{err}
	}
	return nil
}

// sleep pauses for d, or until ctx is done (then answers ctx.Err()).
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// retryDelay is the pause before repeating a call that failed with err: the service's
// Retry-After when it gave one (never less than the backoff's), else the backoff's.
func retryDelay(err error, b *backoff) time.Duration {
	d := b.Next()
	var apiErr *Error
	if errors.As(err, &apiErr) && apiErr.RetryAfter > d {
		d = apiErr.RetryAfter
	}
	return d
}
