package jobq

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeService answers each request with the next of its answers (the last one repeats),
// recording the request bodies.
type fakeService struct {
	mu      sync.Mutex
	answers []func(w http.ResponseWriter)
	bodies  []string
	paths   []string
}

func (f *fakeService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.bodies = append(f.bodies, string(body))
	f.paths = append(f.paths, r.URL.Path)
	answer := f.answers[0]
	if len(f.answers) > 1 {
		f.answers = f.answers[1:]
	}
	f.mu.Unlock()
	answer(w)
}

func (f *fakeService) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.bodies...)
}

func status(code int, header map[string]string, body string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		for k, v := range header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(code)
		_, _ = io.WriteString(w, body)
	}
}

const jobJSON = `{"id": 9, "queue": "q", "type": "t", "status": "pending", "payload": null, "checkpoint": null}`

func fakeClient(t *testing.T, answers ...func(http.ResponseWriter)) (*Client, *fakeService) {
	t.Helper()
	fake := &fakeService{answers: answers}
	server := httptest.NewServer(fake)
	t.Cleanup(server.Close)
	return NewClient(server.URL, WithLogger(log.New(io.Discard, "", 0))), fake
}

func TestEnqueueRetriesTransientAnswersWithOneKey(t *testing.T) {
	c, fake := fakeClient(t,
		status(503, nil, `{"status": 503, "title": "Service Unavailable", "detail": "restarting"}`),
		status(502, nil, `<html>bad gateway</html>`),
		status(429, map[string]string{"Retry-After": "0.05"}, `{"status": 429, "title": "Too Many Requests"}`),
		status(201, nil, jobJSON),
	)
	job, err := c.Enqueue(context.Background(), EnqueueParams{Queue: "q", Type: "t"})
	if err != nil || job.ID != 9 {
		t.Fatalf("Enqueue = %+v, %v", job, err)
	}
	bodies := fake.requests()
	if len(bodies) != 4 {
		t.Fatalf("%d requests, want 4", len(bodies))
	}
	var key string
	for i, body := range bodies {
		var sent struct {
			IdempotencyKey string `json:"idempotency_key"`
		}
		if err := json.Unmarshal([]byte(body), &sent); err != nil || !strings.HasPrefix(sent.IdempotencyKey, "auto:") {
			t.Fatalf("request %d carried no automatic key: %s", i, body)
		}
		if i > 0 && sent.IdempotencyKey != key {
			t.Fatalf("try %d sent key %q, the first %q", i, sent.IdempotencyKey, key)
		}
		key = sent.IdempotencyKey
	}
	if job.Raw == nil || job.Payload != nil || job.Checkpoint != nil {
		t.Errorf("nulls not kept as nil / raw missing: %+v", job)
	}
}

func TestRequestsUnsafeToRepeatAreNotRepeated(t *testing.T) {
	c, fake := fakeClient(t, status(502, nil, "bad gateway"), status(200, nil, `{"jobs": []}`))
	_, err := c.Claim(context.Background(), "w", ClaimParams{Queues: []string{"q"}})
	var apiErr *Error
	if !errors.As(err, &apiErr) || apiErr.Status != 502 || !isTransient(err) {
		t.Fatalf("Claim = %v, want the 502", err)
	}
	if n := len(fake.requests()); n != 1 {
		t.Fatalf("a claim was sent %d times", n)
	}
	// A 429 did nothing on the service's side: any request may go again.
	c, fake = fakeClient(t, status(429, map[string]string{"Retry-After": "0"}, ""), status(200, nil, jobJSON))
	if _, err := c.Cancel(context.Background(), 9); err != nil {
		t.Fatalf("Cancel after a 429: %v", err)
	}
	if n := len(fake.requests()); n != 2 {
		t.Fatalf("%d requests, want 2", n)
	}
}

func TestErrorAnswersAreTypedErrors(t *testing.T) {
	problem := `{"type": "https://jobq.dev/problems/forbidden", "title": "Forbidden", "status": 403, "detail": "key 'v' may not enqueue", "errors": [{"field": "body.queue", "message": "nope"}]}`
	c, fake := fakeClient(t, status(403, nil, problem))
	_, err := c.Enqueue(context.Background(), EnqueueParams{Type: "t"})
	var apiErr *Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("Enqueue = %v, want *Error", err)
	}
	if apiErr.Status != 403 || apiErr.Title != "Forbidden" || apiErr.Detail != "key 'v' may not enqueue" ||
		len(apiErr.Errors) != 1 || apiErr.Errors[0].Field != "body.queue" || string(apiErr.Problem) != problem ||
		apiErr.Transient() {
		t.Errorf("error = %#v", apiErr)
	}
	if want := "jobq: 403 Forbidden: key 'v' may not enqueue [body.queue: nope]"; err.Error() != want {
		t.Errorf("Error() = %q, want %q", err.Error(), want)
	}
	if n := len(fake.requests()); n != 1 {
		t.Errorf("a 403 was sent %d times", n)
	}

	c, _ = fakeClient(t, status(401, nil, "<html>no</html>"))
	_, err = c.GetJob(context.Background(), 1)
	if !errors.As(err, &apiErr) || apiErr.Status != 401 || apiErr.Detail != "<html>no</html>" {
		t.Fatalf("GetJob = %#v", err)
	}
	var made map[string]any
	if json.Unmarshal(apiErr.Problem, &made) != nil || made["status"] != 401.0 || made["title"] != "Unauthorized" {
		t.Errorf("made-up problem = %s", apiErr.Problem)
	}
}

func TestRetryAfterHeader(t *testing.T) {
	if d := parseRetryAfter("2"); d != 2*time.Second {
		t.Errorf("2 -> %s", d)
	}
	if d := parseRetryAfter(time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)); d < 59*time.Minute {
		t.Errorf("date -> %s", d)
	}
	if d := parseRetryAfter("soon"); d != 0 {
		t.Errorf("junk -> %s", d)
	}
}

func TestWaitRetriesTransientFailuresWithinItsTimeout(t *testing.T) {
	finished := strings.Replace(jobJSON, `"pending"`, `"succeeded"`, 1)
	c, fake := fakeClient(t, status(503, nil, ""), status(200, nil, jobJSON), status(200, nil, finished))
	job, err := c.Wait(context.Background(), 9, 5*time.Second)
	if err != nil || job.Status != StatusSucceeded {
		t.Fatalf("Wait = %+v, %v", job, err)
	}
	if n := len(fake.requests()); n != 3 {
		t.Errorf("%d polls, want 3", n)
	}
	c, _ = fakeClient(t, status(503, nil, ""))
	_, err = c.Wait(context.Background(), 9, 300*time.Millisecond)
	var timeout *WaitTimeoutError
	if !errors.As(err, &timeout) || timeout.Job != nil || timeout.Cause == nil {
		t.Fatalf("Wait on a failing service = %v, want a timeout with the cause", err)
	}
}
