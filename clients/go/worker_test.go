package jobq_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	jobq "github.com/jobq/jobq/clients/go"
)

func TestWorkerCompletesJobs(t *testing.T) {
	t.Parallel()
	c, queue := setup(t)
	var mu sync.Mutex
	seen := map[int64]int{} // job id -> attempt
	w := newWorker(t, c, jobq.WorkerConfig{Queues: []string{queue}, Concurrency: 3, PollWait: time.Second})
	w.HandleFunc("echo", func(ctx context.Context, jc *jobq.JobContext) (any, error) {
		mu.Lock()
		seen[jc.Job.ID] = jc.Job.Attempt
		mu.Unlock()
		return map[string]any{"echo": jc.Job.Payload}, nil
	})
	stop := startWorker(t, w)
	var ids []int64
	for i := 0; i < 8; i++ {
		ids = append(ids, enqueue(t, c, jobq.EnqueueParams{Queue: queue, Type: "echo", Payload: i}).ID)
	}
	for i, id := range ids {
		job := waitJob(t, c, id)
		if job.Status != jobq.StatusSucceeded || job.Attempts != 1 ||
			!jsonEqual(t, job.Result, mustJSON(t, map[string]int{"echo": i})) {
			t.Errorf("job %d: %s after %d attempts, result %s", id, job.Status, job.Attempts, job.Result)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if seen[id] != 1 {
			t.Errorf("job %d ran with attempt %d, want 1", id, seen[id])
		}
	}
}

// A busy worker makes at most one request per job: each complete claims the next jobs.
func TestBusyWorkerClaimsWithItsCompletes(t *testing.T) {
	t.Parallel()
	transport := newBlockingTransport()
	c, queue := setup(t, jobq.WithHTTPClient(&http.Client{Transport: transport}))
	const jobs = 40
	params := make([]jobq.EnqueueParams, jobs)
	for i := range params {
		params[i] = jobq.EnqueueParams{Queue: queue, Type: "echo", Payload: i}
	}
	batch, err := c.EnqueueBatch(context.Background(), params, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, c, jobq.WorkerConfig{Queues: []string{queue}, Concurrency: 4, PollWait: 5 * time.Second})
	w.HandleFunc("echo", func(ctx context.Context, jc *jobq.JobContext) (any, error) { return jc.Job.Payload, nil })
	stop := startWorker(t, w)
	for _, job := range batch.Jobs {
		if done := waitJob(t, c, job.ID); done.Status != jobq.StatusSucceeded || !jsonEqual(t, done.Result, job.Payload) {
			t.Fatalf("job %d: %s, result %s", job.ID, done.Status, done.Result)
		}
	}
	claims := transport.count("/v1/claim")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// Completes are shared by jobs that finish together: at most one per job.
	if completes := transport.count("/v1/complete"); completes == 0 || completes > jobs {
		t.Errorf("%d complete requests for %d jobs", completes, jobs)
	}
	// The first claim fills the slots; the completes claim the rest (the claim loop long-polls
	// again only once the queue runs dry).
	if claims > 4 {
		t.Errorf("%d claim requests for %d jobs: the completes did not claim the next ones", claims, jobs)
	}
}

type testRefusal struct{ Reason string }

func (e *testRefusal) Error() string { return "refused: " + e.Reason }

func failingHandler(ctx context.Context, jc *jobq.JobContext) (any, error) {
	return nil, jobq.WithStack(&testRefusal{Reason: "bad input"})
}

func panickingHandler(ctx context.Context, jc *jobq.JobContext) (any, error) {
	var items []int
	return items[3], nil
}

// failureOf answers the recorded failure of a job's first attempt.
func failureOf(t *testing.T, c *jobq.Client, id int64) (kind, message, traceback string) {
	t.Helper()
	events, err := c.JobEvents(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		if e.Kind != "failed" {
			continue
		}
		var data struct {
			Type      string `json:"type"`
			Error     string `json:"error"`
			Traceback string `json:"traceback"`
		}
		if err := json.Unmarshal(e.Data, &data); err != nil {
			t.Fatal(err)
		}
		return data.Type, data.Error, data.Traceback
	}
	t.Fatalf("job %d has no failed event", id)
	return
}

func TestWorkerRecordsHandlerErrors(t *testing.T) {
	t.Parallel()
	c, queue := setup(t)
	w := newWorker(t, c, jobq.WorkerConfig{Queues: []string{queue}, Concurrency: 3, PollWait: time.Second})
	w.HandleFunc("fail", failingHandler)
	w.HandleFunc("panic", panickingHandler)
	w.HandleFunc("final", func(ctx context.Context, jc *jobq.JobContext) (any, error) {
		return nil, jobq.NonRetryable(errors.New("nothing to retry"))
	})
	startWorker(t, w)

	failed := enqueue(t, c, jobq.EnqueueParams{Queue: queue, Type: "fail", MaxAttempts: 1})
	panicked := enqueue(t, c, jobq.EnqueueParams{Queue: queue, Type: "panic", MaxAttempts: 1})
	final := enqueue(t, c, jobq.EnqueueParams{Queue: queue, Type: "final", MaxAttempts: 5})

	job := waitJob(t, c, failed.ID)
	if job.Status != jobq.StatusDead || job.LastError != "jobq_test.testRefusal: refused: bad input" {
		t.Errorf("failed job: %s, last error %q", job.Status, job.LastError)
	}
	kind, message, tb := failureOf(t, c, failed.ID)
	if kind != "jobq_test.testRefusal" || message != "refused: bad input" ||
		!strings.Contains(tb, "_test.failingHandler(") || !strings.Contains(tb, "worker_test.go:") {
		t.Errorf("recorded failure: %q %q\n%s", kind, message, tb)
	}

	job = waitJob(t, c, panicked.ID)
	kind, message, tb = failureOf(t, c, panicked.ID)
	if job.Status != jobq.StatusDead || !strings.HasPrefix(kind, "runtime.") || !strings.Contains(message, "index out of range") ||
		!strings.HasPrefix(tb, "panic: runtime error: index out of range") || !strings.Contains(tb, "_test.panickingHandler(") || strings.Contains(tb, "runtime/debug.Stack") {
		t.Errorf("panicked job %s: %q %q\n%s", job.Status, kind, message, tb)
	}

	job = waitJob(t, c, final.ID)
	if job.Status != jobq.StatusDead || job.Attempts != 1 || job.LastError != "error: nothing to retry" {
		t.Errorf("non-retryable job: %s after %d of 5 attempts (%q)", job.Status, job.Attempts, job.LastError)
	}
}

// started is what a test handler reports when it starts.
type started struct {
	jc  *jobq.JobContext
	ctx context.Context
}

func TestCancelledJobAbortsItsHandler(t *testing.T) {
	t.Parallel()
	c, queue := setup(t)
	starts := make(chan started, 1)
	returned := make(chan error, 1)
	w := newWorker(t, c, jobq.WorkerConfig{Queues: []string{queue}, Lease: 3 * time.Second, PollWait: time.Second})
	w.HandleFunc("hang", func(ctx context.Context, jc *jobq.JobContext) (any, error) {
		starts <- started{jc, ctx}
		<-ctx.Done()
		returned <- jc.AbortReason()
		return "finished anyway", nil // must never be completed
	})
	stop := startWorker(t, w)
	job := enqueue(t, c, jobq.EnqueueParams{Queue: queue, Type: "hang"})
	receive(t, starts, 10*time.Second, "the handler to start")
	if _, err := c.Cancel(context.Background(), job.ID); err != nil {
		t.Fatal(err)
	}
	// The next heartbeat (every second) learns of it.
	if reason := receive(t, returned, 5*time.Second, "the handler's context to be cancelled"); !errors.Is(reason, jobq.ErrJobCancelled) {
		t.Errorf("AbortReason = %v, want ErrJobCancelled", reason)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := getJob(t, c, job.ID); got.Status != jobq.StatusCancelled || got.Result != nil {
		t.Errorf("job after the abort: %s, result %s", got.Status, got.Result)
	}
}

// A worker whose heartbeats do not get through loses the lease to the reaper; once it hears
// of it, the handler's context is cancelled, and what that handler returns is dropped: the
// job's next attempt is the one that counts.
func TestLostLeaseCancelsTheHandler(t *testing.T) {
	t.Parallel()
	transport := newBlockingTransport()
	c, queue := setup(t, jobq.WithHTTPClient(&http.Client{Transport: transport}))
	firstRunning := make(chan *jobq.JobContext, 1)
	firstReturned := make(chan error, 1)
	w := newWorker(t, c, jobq.WorkerConfig{Queues: []string{queue}, Concurrency: 2, Lease: 2 * time.Second, PollWait: time.Second})
	w.HandleFunc("slow", func(ctx context.Context, jc *jobq.JobContext) (any, error) {
		if jc.Job.Attempt > 1 {
			return "second attempt", nil
		}
		firstRunning <- jc
		<-ctx.Done()
		firstReturned <- jc.AbortReason()
		return "first attempt", nil
	})
	stop := startWorker(t, w)
	job := enqueue(t, c, jobq.EnqueueParams{Queue: queue, Type: "slow"})
	jc := receive(t, firstRunning, 10*time.Second, "the first attempt to start")
	transport.block("/v1/heartbeat")
	eventually(t, 15*time.Second, "the reaper to take the lease back", func() bool {
		return getJob(t, c, job.ID).LeaseID != jc.Job.LeaseID || getJob(t, c, job.ID).Status != jobq.StatusRunning
	})
	transport.unblock("/v1/heartbeat")
	if reason := receive(t, firstReturned, 10*time.Second, "the first attempt's context to be cancelled"); !errors.Is(reason, jobq.ErrLeaseLost) {
		t.Errorf("AbortReason = %v, want ErrLeaseLost", reason)
	}
	done := waitJob(t, c, job.ID)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if done.Status != jobq.StatusSucceeded || done.Attempts != 2 || !jsonEqual(t, done.Result, []byte(`"second attempt"`)) {
		t.Errorf("job: %s after %d attempts, result %s; want the second attempt's", done.Status, done.Attempts, done.Result)
	}
}

func TestSaveCheckpoint(t *testing.T) {
	t.Parallel()
	c, queue := setup(t)
	saved := make(chan error, 1)
	proceed := make(chan struct{})
	w := newWorker(t, c, jobq.WorkerConfig{Queues: []string{queue}, PollWait: time.Second})
	w.HandleFunc("etl", func(ctx context.Context, jc *jobq.JobContext) (any, error) {
		err := jc.SaveCheckpoint(map[string]int{"last_id": 800}, map[string]int{"done": 8, "total": 20})
		saved <- err
		if err != nil {
			return nil, err
		}
		<-proceed
		var cp struct {
			LastID int `json:"last_id"`
		}
		if ok, err := jc.DecodeCheckpoint(&cp); !ok || err != nil {
			return nil, errors.New("the saved checkpoint is not on the context")
		}
		return cp.LastID, nil
	})
	startWorker(t, w)
	job := enqueue(t, c, jobq.EnqueueParams{Queue: queue, Type: "etl"})
	if err := receive(t, saved, 10*time.Second, "the save"); err != nil {
		t.Fatalf("SaveCheckpoint: %v", err)
	}
	running := getJob(t, c, job.ID)
	if running.Status != jobq.StatusRunning || !jsonEqual(t, running.Checkpoint, []byte(`{"last_id": 800}`)) ||
		!jsonEqual(t, running.Progress, []byte(`{"done": 8, "total": 20}`)) {
		t.Errorf("running job: %s, checkpoint %s, progress %s", running.Status, running.Checkpoint, running.Progress)
	}
	close(proceed)
	if done := waitJob(t, c, job.ID); done.Status != jobq.StatusSucceeded || !jsonEqual(t, done.Result, []byte(`800`)) {
		t.Errorf("job: %s, result %s", done.Status, done.Result)
	}
}

// Stopping: the handler's next save answers ErrStopRequested, the job is released at once
// (not at the grace period's end nor the lease's) with that checkpoint, and the next worker
// resumes from it.
func TestStopReleasesWithCheckpoint(t *testing.T) {
	t.Parallel()
	c, queue := setup(t)
	firstSave := make(chan struct{})
	var mu sync.Mutex
	var lastSaved int
	var stopErr error
	w := newWorker(t, c, jobq.WorkerConfig{Queues: []string{queue}, Grace: 30 * time.Second, PollWait: time.Second})
	w.HandleFunc("chunks", func(ctx context.Context, jc *jobq.JobContext) (any, error) {
		for i := 1; ; i++ {
			err := jc.SaveCheckpoint(map[string]int{"next": i}, nil)
			if i == 1 {
				close(firstSave)
			}
			if err != nil {
				mu.Lock()
				lastSaved, stopErr = i, err
				mu.Unlock()
				return nil, err
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(50 * time.Millisecond): // one chunk of work
			}
		}
	})
	stop := startWorker(t, w)
	job := enqueue(t, c, jobq.EnqueueParams{Queue: queue, Type: "chunks"})
	receive(t, firstSave, 10*time.Second, "the first save")
	began := time.Now()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("the stop took %s: the job was not handed back at once", took)
	}
	mu.Lock()
	last, err := lastSaved, stopErr
	mu.Unlock()
	if !errors.Is(err, jobq.ErrStopRequested) {
		t.Fatalf("the save while stopping answered %v, want ErrStopRequested", err)
	}
	released := getJob(t, c, job.ID)
	if released.Status != jobq.StatusPending || released.Attempts != 0 ||
		!jsonEqual(t, released.Checkpoint, mustJSON(t, map[string]int{"next": last})) {
		t.Fatalf("released job: %s, %d attempts, checkpoint %s; want pending, 0, {\"next\": %d}",
			released.Status, released.Attempts, released.Checkpoint, last)
	}

	resumed := make(chan json.RawMessage, 1)
	next := newWorker(t, c, jobq.WorkerConfig{Queues: []string{queue}, PollWait: time.Second})
	next.HandleFunc("chunks", func(ctx context.Context, jc *jobq.JobContext) (any, error) {
		resumed <- jc.Checkpoint()
		return "done", nil
	})
	startWorker(t, next)
	if cp := receive(t, resumed, 10*time.Second, "the next worker"); !jsonEqual(t, cp, mustJSON(t, map[string]int{"next": last})) {
		t.Errorf("the next worker started from %s, want {\"next\": %d}", cp, last)
	}
	if done := waitJob(t, c, job.ID); done.Status != jobq.StatusSucceeded {
		t.Errorf("job: %s", done.Status)
	}
}

// A handler still running when the grace period ends has its context cancelled, and its job
// is released keeping the last checkpoint it saved.
func TestGracePeriodEndCancelsAndReleases(t *testing.T) {
	t.Parallel()
	c, queue := setup(t)
	saved := make(chan struct{})
	reasons := make(chan error, 1)
	w := newWorker(t, c, jobq.WorkerConfig{Queues: []string{queue}, Grace: 300 * time.Millisecond, PollWait: time.Second})
	w.HandleFunc("stubborn", func(ctx context.Context, jc *jobq.JobContext) (any, error) {
		if err := jc.SaveCheckpoint("half way", nil); err != nil {
			return nil, err
		}
		close(saved)
		<-jc.Stopping() // told to stop, it goes on...
		<-ctx.Done()    // ...until the grace period ends
		reasons <- jc.AbortReason()
		return nil, ctx.Err()
	})
	stop := startWorker(t, w)
	job := enqueue(t, c, jobq.EnqueueParams{Queue: queue, Type: "stubborn"})
	receive(t, saved, 10*time.Second, "the save")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if reason := receive(t, reasons, time.Second, "the abort"); !errors.Is(reason, jobq.ErrGraceExpired) {
		t.Errorf("AbortReason = %v, want ErrGraceExpired", reason)
	}
	released := getJob(t, c, job.ID)
	if released.Status != jobq.StatusPending || released.Attempts != 0 || !jsonEqual(t, released.Checkpoint, []byte(`"half way"`)) {
		t.Errorf("released job: %s, %d attempts, checkpoint %s", released.Status, released.Attempts, released.Checkpoint)
	}
}

func TestUnknownJobTypeIsReleasedWithADelay(t *testing.T) {
	t.Parallel()
	c, queue := setup(t)
	w := newWorker(t, c, jobq.WorkerConfig{Queues: []string{queue}, PollWait: time.Second, UnknownTypeDelay: time.Hour})
	w.HandleFunc("known", func(ctx context.Context, jc *jobq.JobContext) (any, error) { return nil, nil })
	stop := startWorker(t, w)
	job := enqueue(t, c, jobq.EnqueueParams{Queue: queue, Type: "unknown"})
	eventually(t, 10*time.Second, "the job to be handed back", func() bool {
		return getJob(t, c, job.ID).Status == jobq.StatusScheduled
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	got := getJob(t, c, job.ID)
	if got.Attempts != 0 || got.LastError != "" || got.RunAt.Before(time.Now().Add(50*time.Minute)) {
		t.Errorf("handed back job: %d attempts, error %q, due %s", got.Attempts, got.LastError, got.RunAt)
	}
}

func TestRunAnswersAClaimRefusal(t *testing.T) {
	t.Parallel()
	c, _ := setup(t)
	w := newWorker(t, c, jobq.WorkerConfig{Queues: []string{"not a valid queue name"}})
	err := w.Run(context.Background())
	var apiErr *jobq.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusUnprocessableEntity {
		t.Fatalf("Run = %v, want the 422 of the claim", err)
	}
}

func TestNewWorkerValidates(t *testing.T) {
	c := jobq.NewClient("http://127.0.0.1:1")
	for _, cfg := range []jobq.WorkerConfig{
		{Concurrency: -1},
		{Lease: 500 * time.Millisecond},
		{Lease: 3 * time.Second, HeartbeatInterval: 2 * time.Second},
		{PollWait: time.Minute},
	} {
		if _, err := jobq.NewWorker(c, cfg); err == nil {
			t.Errorf("NewWorker(%+v) accepted", cfg)
		}
	}
	w, err := jobq.NewWorker(c, jobq.WorkerConfig{})
	if err != nil || w.ID() == "" {
		t.Fatalf("defaults: %v", err)
	}
}

func TestJobContextOutsideAWorker(t *testing.T) {
	jc := jobq.NewJobContext(&jobq.Job{ID: 1, Type: "t", Payload: json.RawMessage(`{"a": 1}`)})
	if ok, _ := jc.DecodeCheckpoint(new(any)); ok {
		t.Error("a fresh job has a checkpoint")
	}
	if err := jc.SaveCheckpoint(map[string]int{"n": 2}, nil); err != nil || string(jc.Checkpoint()) != `{"n":2}` {
		t.Errorf("SaveCheckpoint: %v, checkpoint %s", err, jc.Checkpoint())
	}
	if jc.IsStopping() || jc.AbortReason() != nil {
		t.Error("a context outside a worker stops")
	}
}
