package jobq_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	jobq "github.com/jobq/jobq/clients/go"
)

// serverURL answers the jobq server the tests run against, skipping the test without one.
func serverURL(t *testing.T) string {
	t.Helper()
	u := os.Getenv("JOBQ_URL")
	if u == "" {
		t.Skip("JOBQ_URL is not set: these tests need a running jobq server " +
			"(e.g. `jobq serve --port 8766` and JOBQ_URL=http://127.0.0.1:8766)")
	}
	return u
}

// testLogger sends the client's log lines to the test's log while the test runs (a worker's
// last lines may come after it ended).
type testLogger struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func newTestLogger(t *testing.T) *testLogger {
	l := &testLogger{t: t}
	t.Cleanup(func() {
		l.mu.Lock()
		l.done = true
		l.mu.Unlock()
	})
	return l
}

func (l *testLogger) Printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.t.Logf(format, args...)
	}
}

// setup answers a client of the test server and a queue of the test's own, so tests can
// share one server.
func setup(t *testing.T, opts ...jobq.Option) (*jobq.Client, string) {
	t.Helper()
	base := serverURL(t)
	opts = append([]jobq.Option{jobq.WithLogger(newTestLogger(t))}, opts...)
	return jobq.NewClient(base, opts...), uniqueQueue(t)
}

var nonQueueChars = regexp.MustCompile(`[^A-Za-z0-9_.:-]+`)

func uniqueQueue(t *testing.T) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := nonQueueChars.ReplaceAllString(t.Name(), "-")
	if len(name) > 80 {
		name = name[:80]
	}
	return "go-" + name + "-" + hex.EncodeToString(b[:])
}

// eventually polls cond until it holds, failing the test after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// receive waits for a value on ch, failing the test after timeout.
func receive[T any](t *testing.T, ch <-chan T, timeout time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
		panic("unreachable")
	}
}

// startWorker runs w until the answered stop function is called (or the test ends); stop
// begins the graceful stop, waits for Run to return and answers its error.
func startWorker(t *testing.T, w *jobq.Worker) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Errorf("Worker.Run did not return within 30s of the stop")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func newWorker(t *testing.T, c *jobq.Client, cfg jobq.WorkerConfig) *jobq.Worker {
	t.Helper()
	w, err := jobq.NewWorker(c, cfg)
	if err != nil {
		t.Fatalf("NewWorker: %v", err)
	}
	return w
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// jsonEqual reports whether two JSON texts hold the same value.
func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("not JSON: %s", a)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("not JSON: %s", b)
	}
	return reflect.DeepEqual(x, y)
}

func getJob(t *testing.T, c *jobq.Client, id int64) *jobq.Job {
	t.Helper()
	job, err := c.GetJob(context.Background(), id)
	if err != nil {
		t.Fatalf("GetJob(%d): %v", id, err)
	}
	return job
}

func enqueue(t *testing.T, c *jobq.Client, p jobq.EnqueueParams) *jobq.Job {
	t.Helper()
	job, err := c.Enqueue(context.Background(), p)
	if err != nil {
		t.Fatalf("Enqueue(%+v): %v", p, err)
	}
	return job
}

func waitJob(t *testing.T, c *jobq.Client, id int64) *jobq.Job {
	t.Helper()
	job, err := c.Wait(context.Background(), id, 20*time.Second)
	if err != nil {
		t.Fatalf("Wait(%d): %v", id, err)
	}
	return job
}

// -- a TCP proxy that breaks connections --------------------------------------------------

// droppingProxy forwards TCP connections to a server and breaks them the way real networks
// do, knowing no more of HTTP than that bytes from the server after a request are its answer
// and bytes from the client after an answer are its next request on a reused connection:
//
//   - dropAnswers: the connection is reset when an answer comes back, so the server did the
//     work and the client never hears of it;
//   - dropReused: a reused connection is reset the moment its next request arrives, before
//     the server sees it (the keep-alive race).
type droppingProxy struct {
	listener    net.Listener
	upstream    string
	dropAnswers atomic.Int32
	dropReused  atomic.Int32
	dropped     atomic.Int32
	connections atomic.Int32
	wg          sync.WaitGroup
	mu          sync.Mutex
	open        map[net.Conn]struct{} // closed when the test ends
}

func newDroppingProxy(t *testing.T, upstreamURL string) *droppingProxy {
	t.Helper()
	u, err := url.Parse(upstreamURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &droppingProxy{listener: ln, upstream: u.Host, open: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for conn := range p.open {
			_ = conn.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *droppingProxy) URL() string { return "http://" + p.listener.Addr().String() }

func (p *droppingProxy) serve() {
	defer p.wg.Done()
	for {
		conn, err := p.listener.Accept()
		if err != nil {
			return
		}
		p.connections.Add(1)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(conn.(*net.TCPConn))
		}()
	}
}

// take uses up one of a rule's drops, if any are left.
func take(counter *atomic.Int32) bool {
	for {
		n := counter.Load()
		if n <= 0 {
			return false
		}
		if counter.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

func (p *droppingProxy) track(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		p.open[c] = struct{}{}
	}
}

func (p *droppingProxy) untrack(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		delete(p.open, c)
	}
}

func reset(conn *net.TCPConn) {
	_ = conn.SetLinger(0) // close with an RST, as a kernel does for a dead socket
	_ = conn.Close()
}

func (p *droppingProxy) handle(client *net.TCPConn) {
	up, err := net.Dial("tcp", p.upstream)
	if err != nil {
		reset(client)
		return
	}
	upstream := up.(*net.TCPConn)
	p.track(client, upstream)
	defer p.untrack(client, upstream)
	var mu sync.Mutex
	requestSent, answered := false, false
	var once sync.Once
	drop := func() {
		once.Do(func() {
			p.dropped.Add(1)
			reset(client)
			_ = upstream.Close()
		})
	}
	finished := make(chan struct{}, 2)
	go func() { // client -> server
		defer func() { finished <- struct{}{} }()
		buf := make([]byte, 64<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 {
				mu.Lock()
				reused := answered && !requestSent
				answered, requestSent = false, true
				mu.Unlock()
				if reused && take(&p.dropReused) {
					drop()
					return
				}
				if _, werr := upstream.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				_ = upstream.CloseWrite()
				return
			}
		}
	}()
	go func() { // server -> client
		defer func() { finished <- struct{}{} }()
		buf := make([]byte, 64<<10)
		for {
			n, err := upstream.Read(buf)
			if n > 0 {
				mu.Lock()
				answer := requestSent && !answered
				requestSent, answered = false, true
				mu.Unlock()
				if answer && take(&p.dropAnswers) {
					drop()
					return
				}
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				_ = client.CloseWrite()
				return
			}
		}
	}()
	<-finished
	_ = client.Close()
	_ = upstream.Close()
	<-finished
}

// blockingTransport fails requests to chosen paths as if the service could not be reached,
// and counts the requests it lets through per path.
type blockingTransport struct {
	next    http.RoundTripper
	blocked sync.Map // URL path -> struct{}
	mu      sync.Mutex
	counts  map[string]int
}

func (b *blockingTransport) count(path string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.counts[path]
}

func newBlockingTransport() *blockingTransport {
	return &blockingTransport{next: http.DefaultTransport.(*http.Transport).Clone(), counts: map[string]int{}}
}

func (b *blockingTransport) block(path string)   { b.blocked.Store(path, struct{}{}) }
func (b *blockingTransport) unblock(path string) { b.blocked.Delete(path) }

func (b *blockingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if _, ok := b.blocked.Load(req.URL.Path); ok {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	}
	b.mu.Lock()
	b.counts[req.URL.Path]++
	b.mu.Unlock()
	return b.next.RoundTrip(req)
}
