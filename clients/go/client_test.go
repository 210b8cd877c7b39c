package jobq_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	jobq "github.com/jobq/jobq/clients/go"
)

func TestEnqueueGetAndWait(t *testing.T) {
	t.Parallel()
	c, queue := setup(t)
	ctx := context.Background()
	payload := map[string]any{"user": 42.0, "tags": []any{"a", "b"}}
	job := enqueue(t, c, jobq.EnqueueParams{Queue: queue, Type: "welcome", Payload: payload, MaxAttempts: 3, Priority: 5})
	if job.ID <= 0 || job.Status != jobq.StatusPending || job.Queue != queue || job.Type != "welcome" ||
		job.MaxAttempts != 3 || job.Priority != 5 {
		t.Fatalf("enqueued job: %+v", job)
	}
	if !strings.HasPrefix(job.IdempotencyKey, "auto:") {
		t.Errorf("automatic idempotency key = %q, want an auto: key", job.IdempotencyKey)
	}
	if !jsonEqual(t, job.Payload, mustJSON(t, payload)) {
		t.Errorf("payload = %s, want %v", job.Payload, payload)
	}

	got := getJob(t, c, job.ID)
	if got.ID != job.ID || got.Type != "welcome" || !jsonEqual(t, got.Raw, job.Raw) {
		t.Errorf("GetJob = %s, want %s", got.Raw, job.Raw)
	}

	// Nobody works the queue yet: the wait times out, with the job as last seen.
	_, err := c.Wait(ctx, job.ID, 300*time.Millisecond)
	var timeout *jobq.WaitTimeoutError
	if !errors.Is(err, jobq.ErrWaitTimeout) || !errors.As(err, &timeout) || timeout.Job == nil ||
		timeout.Job.Status != jobq.StatusPending {
		t.Fatalf("Wait on a pending job = %v, want a *WaitTimeoutError carrying it", err)
	}

	// A long-poll in flight is answered when the job finishes.
	waited := make(chan *jobq.Job, 1)
	waitErr := make(chan error, 1)
	go func() {
		j, err := c.Wait(ctx, job.ID, 20*time.Second)
		waited <- j
		waitErr <- err
	}()
	claimed, err := c.Claim(ctx, "go-test-worker", jobq.ClaimParams{Queues: []string{queue}, MaxJobs: 5, Lease: 10 * time.Second})
	if err != nil || len(claimed) != 1 || claimed[0].ID != job.ID || claimed[0].Attempt != 1 || claimed[0].LeaseID == "" {
		t.Fatalf("Claim = %v, %v; want job %d, attempt 1", claimed, err, job.ID)
	}
	ref := jobq.LeaseRef{JobID: job.ID, LeaseID: claimed[0].LeaseID}
	res, err := c.Complete(ctx, "go-test-worker", []jobq.CompleteItem{{LeaseRef: ref, Result: mustJSON(t, map[string]int{"sent": 1})}}, nil)
	if err != nil || len(res.Results) != 1 || !res.Results[0].OK {
		t.Fatalf("Complete = %+v, %v", res, err)
	}
	done := receive(t, waited, 10*time.Second, "the wait to answer")
	if err := <-waitErr; err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if done.Status != jobq.StatusSucceeded || !jsonEqual(t, done.Result, []byte(`{"sent": 1}`)) {
		t.Errorf("waited job: status %s result %s", done.Status, done.Result)
	}
	var result struct{ Sent int }
	if err := done.DecodeResult(&result); err != nil || result.Sent != 1 {
		t.Errorf("DecodeResult = %+v, %v", result, err)
	}
}

func TestGetJobNotFound(t *testing.T) {
	t.Parallel()
	c, _ := setup(t)
	_, err := c.GetJob(context.Background(), 1<<62)
	var apiErr *jobq.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound || apiErr.Detail == "" {
		t.Fatalf("GetJob of a missing job = %v, want a 404 *jobq.Error", err)
	}
}

func TestCancelAndRetry(t *testing.T) {
	t.Parallel()
	c, queue := setup(t)
	ctx := context.Background()
	job := enqueue(t, c, jobq.EnqueueParams{Queue: queue, Type: "noop"})
	cancelled, err := c.Cancel(ctx, job.ID)
	if err != nil || cancelled.Status != jobq.StatusCancelled {
		t.Fatalf("Cancel = %+v, %v", cancelled, err)
	}
	retried, err := c.Retry(ctx, job.ID)
	if err != nil || retried.Status != jobq.StatusPending {
		t.Fatalf("Retry = %+v, %v", retried, err)
	}
	_, err = c.Retry(ctx, job.ID) // a pending job cannot be retried
	var apiErr *jobq.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusConflict {
		t.Fatalf("Retry of a pending job = %v, want 409", err)
	}
}

func TestEnqueueBatch(t *testing.T) {
	t.Parallel()
	c, queue := setup(t)
	jobs := []jobq.EnqueueParams{
		{Queue: queue, Type: "a", Payload: 1},
		{Queue: queue, Type: "b", Payload: 2, IdempotencyKey: "batch-key-b"},
		{Queue: queue, Type: "c", Payload: 3, Delay: time.Hour},
	}
	batch, err := c.EnqueueBatch(context.Background(), jobs, &jobq.BatchCallback{
		EnqueueParams: jobq.EnqueueParams{Queue: queue, Type: "done"},
		When:          "all_finished",
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(batch.Jobs) != 3 {
		t.Fatalf("batch answered %d jobs, want 3", len(batch.Jobs))
	}
	for i, job := range batch.Jobs {
		if job.Type != jobs[i].Type || !jsonEqual(t, job.Payload, mustJSON(t, jobs[i].Payload)) {
			t.Errorf("job %d = %s %s, want %s in order", i, job.Type, job.Payload, jobs[i].Type)
		}
	}
	if batch.Jobs[1].IdempotencyKey != "batch-key-b" || !strings.HasPrefix(batch.Jobs[0].IdempotencyKey, "auto:") {
		t.Errorf("keys: %q, %q", batch.Jobs[0].IdempotencyKey, batch.Jobs[1].IdempotencyKey)
	}
	if batch.Jobs[2].Status != jobq.StatusScheduled {
		t.Errorf("delayed job status = %s, want scheduled", batch.Jobs[2].Status)
	}
	if batch.Callback == nil || batch.Callback.Type != "done" || batch.Callback.Status != jobq.StatusWaiting {
		t.Errorf("callback = %+v, want a waiting job", batch.Callback)
	}
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	c, queue := setup(t)
	ctx := context.Background()
	params := jobq.EnqueueParams{Queue: queue, Type: "charge", Payload: map[string]int{"order": 7}, IdempotencyKey: "order-7"}
	first := enqueue(t, c, params)
	again := enqueue(t, c, params)
	if again.ID != first.ID {
		t.Fatalf("same key enqueued jobs %d and %d, want one", first.ID, again.ID)
	}
	params.Payload = map[string]int{"order": 8}
	_, err := c.Enqueue(ctx, params)
	var apiErr *jobq.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusUnprocessableEntity {
		t.Fatalf("same key, other request = %v, want 422", err)
	}
	// Without a key, two calls are two jobs.
	a := enqueue(t, c, jobq.EnqueueParams{Queue: queue, Type: "charge"})
	b := enqueue(t, c, jobq.EnqueueParams{Queue: queue, Type: "charge"})
	if a.ID == b.ID || a.IdempotencyKey == b.IdempotencyKey {
		t.Fatalf("two keyless enqueues answered job %d (%s) and %d (%s)", a.ID, a.IdempotencyKey, b.ID, b.IdempotencyKey)
	}
}

// An enqueue whose answer is lost (the connection is reset after the server did the work) is
// sent again with the same automatic key, and one job exists.
func TestEnqueueRetriedAfterDroppedAnswerCreatesOneJob(t *testing.T) {
	t.Parallel()
	proxy := newDroppingProxy(t, serverURL(t))
	c, queue := setup(t)
	viaProxy := jobq.NewClient(proxy.URL(), jobq.WithLogger(newTestLogger(t)))
	proxy.dropAnswers.Store(2)

	job, err := viaProxy.Enqueue(context.Background(), jobq.EnqueueParams{Queue: queue, Type: "once", Payload: "x"})
	if err != nil {
		t.Fatalf("Enqueue through the proxy: %v", err)
	}
	if got := proxy.dropped.Load(); got != 2 {
		t.Fatalf("the proxy dropped %d answers, want 2", got)
	}
	if got := proxy.connections.Load(); got != 3 {
		t.Errorf("the enqueue took %d connections, want 3 (two dropped, one answered)", got)
	}
	assertJobs(t, c, queue, job.ID)

	// The batch too: its items' automatic keys are reused by the retry.
	proxy.dropAnswers.Store(1)
	b, err := viaProxy.EnqueueBatch(context.Background(), []jobq.EnqueueParams{{Queue: queue, Type: "once-b"}, {Queue: queue, Type: "once-b"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	assertJobs(t, c, queue, job.ID, b.Jobs[0].ID, b.Jobs[1].ID)
}

// A workflow create whose answer is lost is sent again with the same automatic key, and one
// workflow exists; a key of the caller's own answers the workflow it made.
func TestWorkflowCreateRetriedAfterDroppedAnswerCreatesOneWorkflow(t *testing.T) {
	t.Parallel()
	proxy := newDroppingProxy(t, serverURL(t))
	c, queue := setup(t)
	viaProxy := jobq.NewClient(proxy.URL(), jobq.WithLogger(newTestLogger(t)))
	steps := []jobq.Step{
		{Name: "extract", EnqueueParams: jobq.EnqueueParams{Queue: queue, Type: "step"}},
		{Name: "load", After: []string{"extract"}, EnqueueParams: jobq.EnqueueParams{Queue: queue, Type: "step"}},
	}
	proxy.dropAnswers.Store(1)
	wf, err := viaProxy.CreateWorkflow(context.Background(), "go-dropped", steps)
	if err != nil {
		t.Fatalf("CreateWorkflow through the proxy: %v", err)
	}
	if got := proxy.dropped.Load(); got != 1 {
		t.Fatalf("the proxy dropped %d answers, want 1", got)
	}
	assertJobs(t, c, queue, wf.Steps[0].Job.ID, wf.Steps[1].Job.ID)

	key := "go-" + queue
	keyed, err := c.CreateWorkflowWithKey(context.Background(), "go-keyed", key, steps[:1])
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.CreateWorkflowWithKey(context.Background(), "go-keyed", key, steps[:1])
	if err != nil || again.ID != keyed.ID {
		t.Fatalf("the same key and request again = %+v, %v; want workflow %d", again, err, keyed.ID)
	}
	var refused *jobq.Error
	if _, err := c.CreateWorkflowWithKey(context.Background(), "other", key, steps[:1]); !errors.As(err, &refused) || refused.Status != 422 {
		t.Fatalf("the key with another request = %v, want a 422 *jobq.Error", err)
	}
}

// assertJobs checks the queue holds exactly these jobs.
func assertJobs(t *testing.T, c *jobq.Client, queue string, ids ...int64) {
	t.Helper()
	page, err := c.ListJobs(context.Background(), jobq.ListParams{Queue: queue, Limit: 500})
	if err != nil {
		t.Fatal(err)
	}
	want := map[int64]bool{}
	for _, id := range ids {
		want[id] = true
	}
	got := map[int64]bool{}
	for _, job := range page.Jobs {
		got[job.ID] = true
	}
	if len(got) != len(want) {
		t.Fatalf("the queue holds jobs %v, want %v", keys(got), ids)
	}
	for id := range want {
		if !got[id] {
			t.Fatalf("the queue holds jobs %v, want %v", keys(got), ids)
		}
	}
}

func keys(m map[int64]bool) []int64 {
	out := make([]int64, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// A pooled connection reset as the next request goes out on it (the keep-alive race) costs
// the caller nothing.
func TestKeepAliveRaceIsRetried(t *testing.T) {
	t.Parallel()
	proxy := newDroppingProxy(t, serverURL(t))
	c, queue := setup(t)
	viaProxy := jobq.NewClient(proxy.URL(), jobq.WithLogger(newTestLogger(t)))
	ctx := context.Background()
	first, err := viaProxy.Enqueue(ctx, jobq.EnqueueParams{Queue: queue, Type: "race"})
	if err != nil {
		t.Fatal(err)
	}
	proxy.dropReused.Store(1)
	if _, err := viaProxy.GetJob(ctx, first.ID); err != nil {
		t.Fatalf("GetJob on a reset reused connection: %v", err)
	}
	proxy.dropReused.Store(1)
	second, err := viaProxy.Enqueue(ctx, jobq.EnqueueParams{Queue: queue, Type: "race"})
	if err != nil {
		t.Fatalf("Enqueue on a reset reused connection: %v", err)
	}
	if got := proxy.dropped.Load(); got != 2 {
		t.Errorf("the proxy reset %d connections, want 2", got)
	}
	assertJobs(t, c, queue, first.ID, second.ID)
}

func TestWorkflowCreateGetWait(t *testing.T) {
	t.Parallel()
	c, queue := setup(t)
	ctx := context.Background()
	wf, err := c.CreateWorkflow(ctx, "go-etl", []jobq.Step{
		{Name: "extract", EnqueueParams: jobq.EnqueueParams{Queue: queue, Type: "step", Payload: "e"}},
		{Name: "load", After: []string{"extract"}, EnqueueParams: jobq.EnqueueParams{Queue: queue, Type: "step", Payload: "l"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if wf.State != "running" || len(wf.Steps) != 2 || wf.Steps[1].Job.Status != jobq.StatusWaiting {
		t.Fatalf("created workflow: %+v", wf)
	}
	got, err := c.GetWorkflow(ctx, wf.ID)
	if err != nil || got.Name != "go-etl" {
		t.Fatalf("GetWorkflow = %+v, %v", got, err)
	}
	if _, err := c.WaitWorkflow(ctx, wf.ID, 200*time.Millisecond); !errors.Is(err, jobq.ErrWaitTimeout) {
		t.Fatalf("WaitWorkflow with nobody working = %v, want a timeout", err)
	}

	w := newWorker(t, c, jobq.WorkerConfig{Queues: []string{queue}, Concurrency: 2, PollWait: time.Second})
	w.HandleFunc("step", func(ctx context.Context, jc *jobq.JobContext) (any, error) {
		var name string
		_ = jc.DecodePayload(&name)
		return "did " + name, nil
	})
	stop := startWorker(t, w)
	done, err := c.WaitWorkflow(ctx, wf.ID, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if done.State != "succeeded" || done.Counts["succeeded"] != 2 {
		t.Errorf("workflow ended %s (%v), want succeeded", done.State, done.Counts)
	}
	if !jsonEqual(t, done.Steps[1].Job.Result, []byte(`"did l"`)) {
		t.Errorf("load's result = %s", done.Steps[1].Job.Result)
	}
	if err := stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// Against a server with API keys (JOBQ_AUTH_URL, with a producer key JOBQ_AUTH_PRODUCER_KEY
// and one that may not enqueue, JOBQ_AUTH_VIEWER_KEY): 401 and 403 are *jobq.Error values
// carrying the problem.
func TestAuthErrors(t *testing.T) {
	t.Parallel()
	base := os.Getenv("JOBQ_AUTH_URL")
	producer, viewer := os.Getenv("JOBQ_AUTH_PRODUCER_KEY"), os.Getenv("JOBQ_AUTH_VIEWER_KEY")
	if base == "" || producer == "" || viewer == "" {
		t.Skip("JOBQ_AUTH_URL, JOBQ_AUTH_PRODUCER_KEY and JOBQ_AUTH_VIEWER_KEY are not set: " +
			"this test needs a jobq server with API keys (its mapping is also tested offline)")
	}
	queue := uniqueQueue(t)
	ctx := context.Background()
	params := jobq.EnqueueParams{Queue: queue, Type: "secret"}
	cases := []struct {
		key    string
		status int
		title  string
	}{
		{"", http.StatusUnauthorized, "Unauthorized"},
		{viewer, http.StatusForbidden, "Forbidden"},
	}
	for _, tc := range cases {
		c := jobq.NewClient(base, jobq.WithAPIKey(tc.key), jobq.WithLogger(newTestLogger(t)))
		_, err := c.Enqueue(ctx, params)
		var apiErr *jobq.Error
		if !errors.As(err, &apiErr) || apiErr.Status != tc.status || apiErr.Title != tc.title ||
			apiErr.Detail == "" || !strings.Contains(string(apiErr.Problem), `"status":`) {
			t.Errorf("key %q: Enqueue = %#v, want a %d *jobq.Error with the problem", tc.key, err, tc.status)
		}
	}
	c := jobq.NewClient(base, jobq.WithAPIKey(producer), jobq.WithLogger(newTestLogger(t)))
	if job, err := c.Enqueue(ctx, params); err != nil || job.Queue != queue {
		t.Fatalf("Enqueue with a producer key = %+v, %v", job, err)
	}
}
