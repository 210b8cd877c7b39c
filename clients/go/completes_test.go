package jobq_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	jobq "github.com/jobq/jobq/clients/go"
)

// settleCall is one complete, fail or release request as the worker sent it.
type settleCall struct {
	Path      string
	Leases    []jobq.LeaseRef
	ClaimNext int // max_jobs of the claim riding along (0: none)
}

// recordingTransport records the worker's complete, fail and release requests, and can hold
// the next complete until the test lets it go.
type recordingTransport struct {
	next  http.RoundTripper
	mu    sync.Mutex
	calls []settleCall
	gate  chan struct{}   // armed: the next complete waits until it is closed
	held  chan settleCall // told of the complete the gate holds
}

func newRecordingTransport() *recordingTransport {
	return &recordingTransport{next: http.DefaultTransport.(*http.Transport).Clone()}
}

// holdNextComplete arms the gate: the next complete request is reported on held and waits
// until release is called.
func (r *recordingTransport) holdNextComplete(t *testing.T) (held <-chan settleCall, release func()) {
	gate, heldCh := make(chan struct{}), make(chan settleCall, 1)
	r.mu.Lock()
	r.gate, r.held = gate, heldCh
	r.mu.Unlock()
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	return heldCh, release
}

func (r *recordingTransport) callsTo(path string) []settleCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []settleCall
	for _, c := range r.calls {
		if c.Path == path {
			out = append(out, c)
		}
	}
	return out
}

func (r *recordingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	path := req.URL.Path
	if path != "/v1/complete" && path != "/v1/fail" && path != "/v1/release" {
		return r.next.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, err
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	var sent struct {
		Leases    []jobq.LeaseRef `json:"leases"`
		ClaimNext *struct {
			MaxJobs int `json:"max_jobs"`
		} `json:"claim_next"`
	}
	if err := json.Unmarshal(body, &sent); err != nil {
		return nil, err
	}
	call := settleCall{Path: path, Leases: sent.Leases}
	if sent.ClaimNext != nil {
		call.ClaimNext = sent.ClaimNext.MaxJobs
	}
	r.mu.Lock()
	r.calls = append(r.calls, call)
	var gate chan struct{}
	if path == "/v1/complete" && r.gate != nil {
		gate, r.gate = r.gate, nil
		r.held <- call
	}
	r.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	}
	return r.next.RoundTrip(req)
}

// jobIDs counts how often each job appears in the calls' leases.
func jobIDs(calls []settleCall) map[int64]int {
	out := map[int64]int{}
	for _, c := range calls {
		for _, l := range c.Leases {
			out[l.JobID]++
		}
	}
	return out
}

func enqueueEchoes(t *testing.T, c *jobq.Client, queue, jobType string, n int) []*jobq.Job {
	t.Helper()
	params := make([]jobq.EnqueueParams, n)
	for i := range params {
		params[i] = jobq.EnqueueParams{Queue: queue, Type: jobType, Payload: i}
	}
	batch, err := c.EnqueueBatch(context.Background(), params, nil)
	if err != nil {
		t.Fatal(err)
	}
	return batch.Jobs
}

// Jobs whose handlers return while a complete is in flight go out together in the next one.
func TestSharedCompleteCarriesJobsThatFinishMeanwhile(t *testing.T) {
	t.Parallel()
	rec := newRecordingTransport()
	c, queue := setup(t, jobq.WithHTTPClient(&http.Client{Transport: rec}))
	const n = 8
	jobs := enqueueEchoes(t, c, queue, "echo", n)
	held, release := rec.holdNextComplete(t)
	w := newWorker(t, c, jobq.WorkerConfig{Queues: []string{queue}, Concurrency: n, PollWait: time.Second})
	w.HandleFunc("echo", func(ctx context.Context, jc *jobq.JobContext) (any, error) { return jc.Job.Payload, nil })
	stop := startWorker(t, w)
	first := receive(t, held, 10*time.Second, "the first complete")
	eventually(t, 10*time.Second, "the other jobs to queue behind it", func() bool {
		return len(first.Leases)+w.QueuedCompletes() == n
	})
	release()
	for _, job := range jobs {
		done := waitJob(t, c, job.ID)
		if done.Status != jobq.StatusSucceeded || done.Attempts != 1 || !jsonEqual(t, done.Result, job.Payload) {
			t.Errorf("job %d: %s after %d attempts, result %s", job.ID, done.Status, done.Attempts, done.Result)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	completes := rec.callsTo("/v1/complete")
	if len(completes) != 2 {
		t.Errorf("%d complete requests for %d jobs, want 2 (the held one and one for the rest)", len(completes), n)
	}
	counts := jobIDs(completes)
	for _, job := range jobs {
		if counts[job.ID] != 1 {
			t.Errorf("job %d was in %d complete requests, want 1", job.ID, counts[job.ID])
		}
	}
	if first.ClaimNext < len(first.Leases) {
		t.Errorf("the complete of %d jobs claimed for %d slots: not for all it freed", len(first.Leases), first.ClaimNext)
	}
}

// Each job of a shared complete gets its own verdict: one whose job was cancelled while it
// waited is refused, the others in the same request are completed, and the worker goes on.
func TestSharedCompleteRefusalOfOneJob(t *testing.T) {
	t.Parallel()
	rec := newRecordingTransport()
	c, queue := setup(t, jobq.WithHTTPClient(&http.Client{Transport: rec}))
	first := enqueue(t, c, jobq.EnqueueParams{Queue: queue, Type: "first", Payload: "a"})
	held, release := rec.holdNextComplete(t)
	goOn := make(chan struct{})
	// 4 slots: the held complete's claim keeps one, and the claim loop has one for each later job.
	w := newWorker(t, c, jobq.WorkerConfig{Queues: []string{queue}, Concurrency: 4, PollWait: time.Second})
	w.HandleFunc("first", func(ctx context.Context, jc *jobq.JobContext) (any, error) { return jc.Job.Payload, nil })
	w.HandleFunc("later", func(ctx context.Context, jc *jobq.JobContext) (any, error) {
		<-goOn
		return jc.Job.Payload, nil
	})
	stop := startWorker(t, w)
	if call := receive(t, held, 10*time.Second, "the first complete"); len(call.Leases) != 1 || call.Leases[0].JobID != first.ID {
		t.Fatalf("the first complete carried %v, want job %d alone", call.Leases, first.ID)
	}
	cancelled := enqueue(t, c, jobq.EnqueueParams{Queue: queue, Type: "later", Payload: "b"})
	kept := enqueue(t, c, jobq.EnqueueParams{Queue: queue, Type: "later", Payload: "c"})
	eventually(t, 10*time.Second, "both later jobs to run", func() bool {
		return getJob(t, c, cancelled.ID).Status == jobq.StatusRunning && getJob(t, c, kept.ID).Status == jobq.StatusRunning
	})
	close(goOn)
	eventually(t, 10*time.Second, "both to queue for the next complete", func() bool { return w.QueuedCompletes() == 2 })
	if _, err := c.Cancel(context.Background(), cancelled.ID); err != nil {
		t.Fatal(err)
	}
	release()
	for _, job := range []*jobq.Job{first, kept} {
		if done := waitJob(t, c, job.ID); done.Status != jobq.StatusSucceeded || !jsonEqual(t, done.Result, job.Payload) {
			t.Errorf("job %d: %s, result %s", job.ID, done.Status, done.Result)
		}
	}
	after := enqueue(t, c, jobq.EnqueueParams{Queue: queue, Type: "first", Payload: "d"})
	if done := waitJob(t, c, after.ID); done.Status != jobq.StatusSucceeded {
		t.Errorf("the job after the refusal: %s", done.Status)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := getJob(t, c, cancelled.ID); got.Status != jobq.StatusCancelled || got.Result != nil {
		t.Errorf("cancelled job: %s, result %s", got.Status, got.Result)
	}
	completes := rec.callsTo("/v1/complete")
	if len(completes) != 3 || len(completes[1].Leases) != 2 {
		t.Errorf("complete requests %+v; want 3, the second carrying both later jobs", completes)
	}
}

// A job whose lease the worker has heard is lost never goes into a complete, fail or release,
// while the jobs around it are completed.
func TestLostLeaseIsNeverSettled(t *testing.T) {
	t.Parallel()
	rec := newRecordingTransport()
	c, queue := setup(t, jobq.WithHTTPClient(&http.Client{Transport: rec}))
	started := make(chan struct{}, 1)
	returned := make(chan error, 1)
	w := newWorker(t, c, jobq.WorkerConfig{Queues: []string{queue}, Concurrency: 4, Lease: 3 * time.Second, PollWait: time.Second})
	w.HandleFunc("hang", func(ctx context.Context, jc *jobq.JobContext) (any, error) {
		started <- struct{}{}
		<-ctx.Done()
		returned <- jc.AbortReason()
		return "finished anyway", nil
	})
	w.HandleFunc("echo", func(ctx context.Context, jc *jobq.JobContext) (any, error) { return jc.Job.Payload, nil })
	stop := startWorker(t, w)
	hung := enqueue(t, c, jobq.EnqueueParams{Queue: queue, Type: "hang"})
	receive(t, started, 10*time.Second, "the hanging handler to start")
	echoes := enqueueEchoes(t, c, queue, "echo", 20)
	if _, err := c.Cancel(context.Background(), hung.ID); err != nil {
		t.Fatal(err)
	}
	// The next heartbeat (every second) learns of it.
	if reason := receive(t, returned, 5*time.Second, "the handler's abort"); !errors.Is(reason, jobq.ErrJobCancelled) {
		t.Errorf("AbortReason = %v, want ErrJobCancelled", reason)
	}
	more := enqueueEchoes(t, c, queue, "echo", 20)
	for _, job := range append(echoes, more...) {
		if done := waitJob(t, c, job.ID); done.Status != jobq.StatusSucceeded {
			t.Errorf("job %d: %s", job.ID, done.Status)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/v1/complete", "/v1/fail", "/v1/release"} {
		if n := jobIDs(rec.callsTo(path))[hung.ID]; n != 0 {
			t.Errorf("the lost job went out in %d %s requests", n, path)
		}
	}
	if got := getJob(t, c, hung.ID); got.Status != jobq.StatusCancelled || got.Result != nil {
		t.Errorf("lost job: %s, result %s", got.Status, got.Result)
	}
}

// A stop that begins while a shared complete is out: the jobs its claim took are handed back
// once each, never run, and the completes go through.
func TestStopDuringSharedCompleteReleasesOnce(t *testing.T) {
	t.Parallel()
	rec := newRecordingTransport()
	c, queue := setup(t, jobq.WithHTTPClient(&http.Client{Transport: rec}))
	jobs := enqueueEchoes(t, c, queue, "echo", 4)
	held, release := rec.holdNextComplete(t)
	var mu sync.Mutex
	ran := map[int64]int{}
	w := newWorker(t, c, jobq.WorkerConfig{Queues: []string{queue}, Concurrency: 2, PollWait: time.Second})
	w.HandleFunc("echo", func(ctx context.Context, jc *jobq.JobContext) (any, error) {
		mu.Lock()
		ran[jc.Job.ID]++
		mu.Unlock()
		return jc.Job.Payload, nil
	})
	stop := startWorker(t, w)
	first := receive(t, held, 10*time.Second, "the first complete")
	if first.ClaimNext == 0 {
		t.Fatal("the first complete claimed nothing: the stop would not meet a claim")
	}
	w.Stop()
	release()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	released := jobIDs(rec.callsTo("/v1/release"))
	if len(released) == 0 {
		t.Error("nothing was handed back, though the complete claimed jobs after the stop began")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, job := range jobs {
		got := getJob(t, c, job.ID)
		switch {
		case released[job.ID] > 1:
			t.Errorf("job %d released %d times", job.ID, released[job.ID])
		case released[job.ID] == 1 && (ran[job.ID] != 0 || got.Status != jobq.StatusPending || got.Attempts != 0):
			t.Errorf("handed back job %d: ran %d times, %s after %d attempts", job.ID, ran[job.ID], got.Status, got.Attempts)
		case released[job.ID] == 0 && ran[job.ID] == 1 && got.Status != jobq.StatusSucceeded:
			t.Errorf("job %d ran but is %s", job.ID, got.Status)
		case released[job.ID] == 0 && ran[job.ID] == 0 && (got.Status != jobq.StatusPending || got.Attempts != 0):
			t.Errorf("job %d never claimed, but %s after %d attempts", job.ID, got.Status, got.Attempts)
		case ran[job.ID] > 1:
			t.Errorf("job %d ran %d times", job.ID, ran[job.ID])
		}
	}
	if counts := jobIDs(rec.callsTo("/v1/complete")); len(counts) != len(ran) {
		t.Errorf("%d jobs completed, %d ran", len(counts), len(ran))
	}
}

// However completes are shared, no more handlers run at once than the concurrency.
func TestSharedCompletesKeepTheConcurrency(t *testing.T) {
	t.Parallel()
	c, queue := setup(t)
	const concurrency, n = 4, 120
	jobs := enqueueEchoes(t, c, queue, "work", n)
	var running, most atomic.Int32
	var mu sync.Mutex
	ran := map[int64]int{}
	w := newWorker(t, c, jobq.WorkerConfig{Queues: []string{queue}, Concurrency: concurrency, PollWait: time.Second})
	w.HandleFunc("work", func(ctx context.Context, jc *jobq.JobContext) (any, error) {
		now := running.Add(1)
		defer running.Add(-1)
		for seen := most.Load(); now > seen && !most.CompareAndSwap(seen, now); seen = most.Load() {
		}
		mu.Lock()
		ran[jc.Job.ID]++
		mu.Unlock()
		time.Sleep(time.Duration(jc.Job.ID%3) * time.Millisecond) // the work: 0-2 ms
		return jc.Job.Payload, nil
	})
	stop := startWorker(t, w)
	for _, job := range jobs {
		if done := waitJob(t, c, job.ID); done.Status != jobq.StatusSucceeded || done.Attempts != 1 {
			t.Errorf("job %d: %s after %d attempts", job.ID, done.Status, done.Attempts)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if m := most.Load(); m > concurrency {
		t.Errorf("%d handlers ran at once, concurrency %d", m, concurrency)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, job := range jobs {
		if ran[job.ID] != 1 {
			t.Errorf("job %d ran %d times", job.ID, ran[job.ID])
		}
	}
}

// A wide worker keeps its connections: requests, fails one per job among them, do not open a
// connection each.
func TestWorkerReusesItsConnections(t *testing.T) {
	t.Parallel()
	producer, queue := setup(t)
	proxy := newDroppingProxy(t, serverURL(t))
	c := jobq.NewClient(proxy.URL(), jobq.WithLogger(newTestLogger(t)))
	const concurrency, n = 16, 300
	jobs := enqueueEchoes(t, producer, queue, "work", n)
	w := newWorker(t, c, jobq.WorkerConfig{Queues: []string{queue}, Concurrency: concurrency, PollWait: time.Second})
	w.HandleFunc("work", func(ctx context.Context, jc *jobq.JobContext) (any, error) {
		if jc.Job.ID%2 == 0 {
			return nil, jobq.NonRetryable(errors.New("even"))
		}
		return nil, nil
	})
	stop := startWorker(t, w)
	for _, job := range jobs {
		if done := waitJob(t, producer, job.ID); !done.Status.Finished() {
			t.Errorf("job %d: %s", job.ID, done.Status)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// In flight at once: a long-poll, a heartbeat, a shared complete and a fail per slot.
	if opened := proxy.connections.Load(); opened > concurrency+8 {
		t.Errorf("%d connections opened for %d jobs at concurrency %d", opened, n, concurrency)
	}
}
