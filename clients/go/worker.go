package jobq

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"
)

// The worker runs up to Concurrency handlers, each in a goroutine of its own. Besides them,
// while Run runs:
//
//   - the claim loop long-polls POST /v1/claim for as many jobs as there are free slots;
//   - the lease keeper's heartbeat loop sends, every HeartbeatInterval, one POST /v1/heartbeat
//     for every held lease; an item answered ok: false (lease lost, or the job cancelled)
//     cancels that handler's context, and the worker never completes, fails or releases that
//     job afterwards;
//   - per job, a supervisor runs the handler and has the lease keeper complete (returned),
//     fail (returned an error, or panicked) or release (stopped) the job. A job of a type the
//     worker has no handler for is released for UnknownTypeDelay, never failed. Unless
//     stopping, that same request claims the worker's next jobs (claim_next, without waiting)
//     for the slots it frees and any other free one; the claim loop long-polls only for slots
//     no settle call is claiming for already;
//   - completes are shared (completes.go): one request at a time carries every job whose
//     handler returned since the one before went out, and claims for all the slots they free,
//     so a wide, busy worker makes one request per batch, not per job. Fails and releases go
//     one job per request.
//
// Stopping (Run's context done, or Stop): claiming stops at once, every JobContext reports
// Stopping, and a handler's next SaveCheckpoint saves and then answers ErrStopRequested,
// after which the job is released with that checkpoint so the next worker starts at once.
// Handlers still running after Grace have their contexts cancelled (AbortReason
// ErrGraceExpired) and their jobs released keeping the last saved checkpoint.

const (
	maxClaimJobs = 100 // the service's per-claim limit
	// An empty claim answered faster than this (no long-poll) is followed by a pause.
	idlePause             = 500 * time.Millisecond
	maxReleaseDelay       = 30 * 24 * time.Hour
	maxLease              = 12 * time.Hour
	defaultLease          = 30 * time.Second
	defaultGrace          = 30 * time.Second
	defaultConcurrency    = 4
	defaultUnknownTypeFor = time.Minute
	// After the grace period has cancelled the handlers' contexts, how long Run waits for
	// handlers that ignore it before releasing their jobs without them.
	handlerExitWait = 5 * time.Second
)

// Handler runs jobs of one type. It returns the job's result (any JSON value, nil for
// none), or an error to fail the attempt: retried after a backoff until the job's
// max_attempts, unless marked with NonRetryable. A panic is recovered and fails the attempt
// with the panicking goroutine's stack.
//
// ctx is cancelled when the job is aborted (jc.AbortReason says why); after a lost lease or a
// cancellation whatever the handler returns is ignored. Returning ErrStopRequested (as
// SaveCheckpoint answers it while the worker stops) hands the job back without charging the
// attempt.
type Handler interface {
	Work(ctx context.Context, jc *JobContext) (any, error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, jc *JobContext) (any, error)

// Work calls f(ctx, jc).
func (f HandlerFunc) Work(ctx context.Context, jc *JobContext) (any, error) { return f(ctx, jc) }

// WorkerConfig configures a Worker; the zero value of a field takes its default.
type WorkerConfig struct {
	Queues      []string // default ["default"]
	Concurrency int      // handlers running at once (default 4)
	// Lease is the lease each claim asks for: whole seconds, 1 s to 12 h (default 30 s).
	Lease time.Duration
	// HeartbeatInterval: how often held leases are extended (default Lease / 3; at most
	// Lease / 3, so that two heartbeats can fail before a lease expires).
	HeartbeatInterval time.Duration
	// Grace is how long a stopping worker waits for its handlers before cancelling their
	// contexts (default 30 s; negative: none, they are cancelled at once). Stop a second time
	// to end it early.
	Grace time.Duration
	// PollWait is the claim's long-poll wait (default and at most 20 s; negative: none).
	PollWait time.Duration
	// WorkerID names the worker to the service (default host:pid:random).
	WorkerID string
	// UnknownTypeDelay: a job of a type without a handler is released for this long (default
	// 1 min; negative: none): long enough not to bounce between old workers in a rolling
	// deploy, short enough that a new one soon runs it.
	UnknownTypeDelay time.Duration
	// DisableClaimNext makes settle calls only settle, the claim loop doing all claiming.
	DisableClaimNext bool
	// Logger receives the worker's log lines (default: the Client's logger).
	Logger Logger
}

// Worker claims jobs from its queues and runs their handlers, keeping their leases with
// batched heartbeats, and stops gracefully. Register handlers with Handle / HandleFunc before
// Run.
type Worker struct {
	client       *Client
	cfg          WorkerConfig
	leaseSeconds int
	logger       Logger

	mu          sync.Mutex
	handlers    map[string]Handler
	run         *workerRun // the running Run's state; nil when not running
	stopPending bool       // Stop came before Run
}

// workerRun is one Run's state; its counters are guarded by Worker.mu.
type workerRun struct {
	base        context.Context // the handlers' contexts' parent: Run's values, no cancel
	keeper      *leaseKeeper
	stopping    chan struct{} // closed when the stop begins
	graceOver   chan struct{} // closed by a second Stop
	stopped     bool
	graceEnded  bool
	cancelClaim context.CancelFunc
	slotFree    chan struct{} // a slot may have come free (buffered, 1)
	wg          sync.WaitGroup

	holding     int // jobs held
	claiming    int // slots asked for by claims in flight (the loop's and claim_next's)
	handingOver int // held jobs whose settle call claims for their own slot

	toComplete     []sharedComplete // jobs waiting for the next shared complete (completes.go)
	completeQueued chan struct{}    // toComplete may have grown (buffered, 1)
}

// NewWorker answers a worker using client, or an error when cfg is invalid.
func NewWorker(client *Client, cfg WorkerConfig) (*Worker, error) {
	if client == nil {
		return nil, errors.New("jobq: NewWorker needs a Client")
	}
	if len(cfg.Queues) == 0 {
		cfg.Queues = []string{"default"}
	}
	cfg.Queues = append([]string(nil), cfg.Queues...)
	if cfg.Concurrency == 0 {
		cfg.Concurrency = defaultConcurrency
	}
	if cfg.Lease == 0 {
		cfg.Lease = defaultLease
	}
	// Zero takes the default, so "none" is spelled negative.
	cfg.Grace = orDefault(cfg.Grace, defaultGrace)
	cfg.PollWait = orDefault(cfg.PollWait, maxPollWait)
	cfg.UnknownTypeDelay = orDefault(cfg.UnknownTypeDelay, defaultUnknownTypeFor)
	if cfg.WorkerID == "" {
		cfg.WorkerID = DefaultWorkerID()
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = cfg.Lease / 3
	}
	switch {
	case cfg.Concurrency < 1:
		return nil, errors.New("jobq: Concurrency must be at least 1")
	case cfg.Lease < time.Second || cfg.Lease > maxLease:
		return nil, errors.New("jobq: Lease must be within 1s..12h")
	case cfg.HeartbeatInterval <= 0 || cfg.HeartbeatInterval > cfg.Lease/3:
		return nil, errors.New("jobq: HeartbeatInterval must be > 0 and at most Lease/3, so that two heartbeats can fail before the lease expires")
	case cfg.PollWait > maxPollWait:
		return nil, errors.New("jobq: PollWait must be at most 20s")
	case cfg.UnknownTypeDelay > maxReleaseDelay:
		return nil, errors.New("jobq: UnknownTypeDelay must be within 0..720h")
	}
	w := &Worker{
		client:       client,
		cfg:          cfg,
		leaseSeconds: wholeSeconds(cfg.Lease),
		logger:       cfg.Logger,
		handlers:     make(map[string]Handler),
	}
	if w.logger == nil {
		w.logger = client.logger
	}
	return w, nil
}

func orDefault(d, def time.Duration) time.Duration {
	switch {
	case d == 0:
		return def
	case d < 0:
		return 0
	}
	return d
}

// DefaultWorkerID names this host and process, plus a random part so two workers never
// share an id.
func DefaultWorkerID() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// ID answers the worker's id.
func (w *Worker) ID() string { return w.cfg.WorkerID }

func (w *Worker) logf(format string, args ...any) { w.logger.Printf(format, args...) }

// Handle registers h for jobs of jobType. It panics when jobType has a handler already.
func (w *Worker) Handle(jobType string, h Handler) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if h == nil {
		panic("jobq: nil handler for " + jobType)
	}
	if _, ok := w.handlers[jobType]; ok {
		panic("jobq: a handler for " + jobType + " is registered already")
	}
	w.handlers[jobType] = h
}

// HandleFunc registers f for jobs of jobType.
func (w *Worker) HandleFunc(jobType string, f func(ctx context.Context, jc *JobContext) (any, error)) {
	w.Handle(jobType, HandlerFunc(f))
}

func (w *Worker) handler(jobType string) Handler {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.handlers[jobType]
}

func (w *Worker) jobTypes() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	types := make([]string, 0, len(w.handlers))
	for t := range w.handlers {
		types = append(types, t)
	}
	sort.Strings(types)
	if len(types) == 0 {
		return "nothing"
	}
	return strings.Join(types, ", ")
}

// -- running --------------------------------------------------------------------------------

// Run claims and runs jobs until ctx is done or Stop is called, then stops gracefully (see
// the package documentation) and answers nil once every job is settled or handed back.
// Stopping on SIGTERM and SIGINT:
//
//	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
//	defer stop()
//	err := worker.Run(ctx)
//
// Handlers' contexts carry ctx's values but not its cancellation: the stop does not cancel
// them, the end of the grace period does. Transient errors are logged and retried; an error
// answer to a claim that retrying will not mend (401, 403, an invalid queue name) stops the
// worker, and Run answers it.
func (w *Worker) Run(ctx context.Context) error {
	rs, err := w.startRun(ctx)
	if err != nil {
		return err
	}
	defer func() {
		w.mu.Lock()
		w.run = nil
		w.mu.Unlock()
	}()
	w.logf("worker %s: queues %s, concurrency %d, lease %ds, handlers: %s",
		w.cfg.WorkerID, strings.Join(w.cfg.Queues, ","), w.cfg.Concurrency, w.leaseSeconds, w.jobTypes())

	heartbeatCtx, stopHeartbeats := context.WithCancel(rs.base)
	heartbeatsDone := make(chan struct{})
	go func() {
		defer close(heartbeatsDone)
		rs.keeper.runHeartbeats(heartbeatCtx)
	}()
	completerQuit, completerDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(completerDone)
		w.runCompleter(rs, completerQuit)
	}()
	claimCtx, cancelClaim := context.WithCancel(rs.base)
	w.mu.Lock()
	rs.cancelClaim = cancelClaim
	stopNow := rs.stopped // Stop came before Run got here
	w.mu.Unlock()
	if stopNow {
		cancelClaim()
	}
	claimDone := make(chan error, 1)
	go func() { claimDone <- w.claimLoop(claimCtx, rs) }()

	var fatal error
	claimEnded := false
	select {
	case <-ctx.Done():
	case <-rs.stopping:
	case fatal = <-claimDone:
		claimEnded = true
	}
	w.beginStop(rs)
	if !claimEnded {
		fatal = <-claimDone
	}
	w.drain(rs)
	close(completerQuit)
	<-completerDone
	stopHeartbeats()
	<-heartbeatsDone
	w.logf("worker %s stopped", w.cfg.WorkerID)
	return fatal
}

func (w *Worker) startRun(ctx context.Context) (*workerRun, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.run != nil {
		return nil, errors.New("jobq: this worker is running already")
	}
	rs := &workerRun{
		base:      detached{ctx},
		stopping:  make(chan struct{}),
		graceOver: make(chan struct{}),
		slotFree:  make(chan struct{}, 1),

		completeQueued: make(chan struct{}, 1),
	}
	rs.keeper = newLeaseKeeper(w, rs.stopping)
	if w.stopPending {
		w.stopPending = false
		rs.stopped = true
		close(rs.stopping)
	}
	w.run = rs
	return rs, nil
}

// Stop begins a graceful stop, as the end of Run's context does; a second call ends the
// grace period at once. Safe to call from any goroutine, and before Run (which then stops
// at once).
func (w *Worker) Stop() {
	w.mu.Lock()
	rs := w.run
	if rs == nil {
		w.stopPending = true
		w.mu.Unlock()
		return
	}
	if rs.stopped {
		if !rs.graceEnded {
			rs.graceEnded = true
			close(rs.graceOver)
			w.mu.Unlock()
			w.logf("worker %s: second stop request, ending the grace period", w.cfg.WorkerID)
			return
		}
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	w.beginStop(rs)
}

// beginStop stops claiming now (the long-poll in flight is cancelled) and tells every handler.
func (w *Worker) beginStop(rs *workerRun) {
	w.mu.Lock()
	if rs.stopped {
		cancelClaim := rs.cancelClaim
		w.mu.Unlock()
		if cancelClaim != nil {
			cancelClaim()
		}
		return
	}
	rs.stopped = true
	close(rs.stopping) // every JobContext's Stopping
	holding := rs.holding
	cancelClaim := rs.cancelClaim
	w.mu.Unlock()
	if cancelClaim != nil {
		cancelClaim()
	}
	w.logf("worker %s: stopping (holding %d jobs, grace %s)", w.cfg.WorkerID, holding, w.cfg.Grace)
}

// drain waits for the handlers up to the grace period, then cancels those still running and
// waits for them to return; handlers that ignore their cancelled context have their jobs
// released without them.
func (w *Worker) drain(rs *workerRun) {
	all := make(chan struct{})
	go func() {
		rs.wg.Wait()
		close(all)
	}()
	grace := time.NewTimer(w.cfg.Grace)
	defer grace.Stop()
	select {
	case <-all:
		return
	case <-grace.C:
	case <-rs.graceOver:
	}
	if n := rs.keeper.abortRunning(ErrGraceExpired); n > 0 {
		w.logf("worker %s: cancelling %d handlers still running after the grace period", w.cfg.WorkerID, n)
	}
	exit := time.NewTimer(handlerExitWait)
	defer exit.Stop()
	select {
	case <-all:
		return
	case <-exit.C:
	}
	abandoned := rs.keeper.abandonRunning()
	if len(abandoned) > 0 {
		w.logf("worker %s: %d handlers ignore their cancelled context; releasing their jobs without them", w.cfg.WorkerID, len(abandoned))
		items := make([]ReleaseItem, len(abandoned))
		for i, h := range abandoned {
			items[i] = ReleaseItem{LeaseRef: h.ref}
		}
		if _, err := w.client.Release(context.Background(), w.cfg.WorkerID, items, nil); err != nil {
			w.logf("worker %s: releasing abandoned jobs failed (%v); they return when their leases expire", w.cfg.WorkerID, err)
		}
	}
	// The jobs whose handlers did return are being settled: wait for those.
	for _, h := range rs.keeper.jobs() {
		rs.keeper.mu.Lock()
		settling := h.done
		rs.keeper.mu.Unlock()
		if settling {
			<-h.finished
		}
	}
}

// detached carries a context's values without its cancellation (context.WithoutCancel
// before Go 1.21): the handlers' contexts must outlive Run's, which only starts the stop.
type detached struct{ parent context.Context }

func (d detached) Deadline() (time.Time, bool) { return time.Time{}, false }
func (d detached) Done() <-chan struct{}       { return nil }
func (d detached) Err() error                  { return nil }
func (d detached) Value(key any) any           { return d.parent.Value(key) }
func (d detached) String() string              { return "jobq.detached" }

var _ context.Context = detached{}
