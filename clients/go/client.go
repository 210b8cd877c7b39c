package jobq

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

const (
	// DefaultBaseURL is where `jobq serve` listens by default.
	DefaultBaseURL = "http://127.0.0.1:8000"
	userAgent      = "jobq-go/0.1"
	defaultTimeout = 30 * time.Second
	// Tries after the first of a request that failed transiently (see Client for which).
	defaultMaxRetries = 4
	// The longest wait_seconds of one long-poll the service takes.
	maxPollWait = 20 * time.Second
	// How much of an error answer's body is read.
	maxErrorBody = 1 << 20
)

// Logger receives the client's and the worker's log lines (retries, lost leases, failures,
// shutdown). *log.Logger satisfies it.
type Logger interface {
	Printf(format string, args ...any)
}

// Client is a client of the jobq HTTP API: enqueue, read and await jobs and workflows,
// cancel and retry them, and the worker protocol's calls. It is safe for concurrent use.
//
// Error answers are returned as *Error. Failures are retried with a backoff when repeating
// the request cannot do harm: a 429 always (the service did nothing); for requests that are
// safe to send twice (reads, enqueues, which always carry an idempotency key, heartbeats and
// settles without a claim riding along) also 408 / 5xx answers, broken connections and
// request timeouts; for any request, a connection that could not be opened.
type Client struct {
	baseURL    string
	apiKey     string
	httpClient *http.Client
	timeout    time.Duration
	maxRetries int
	logger     Logger
}

// Option configures a Client.
type Option func(*Client)

// WithAPIKey sends key as a bearer token with every request (needed once the service has
// API keys; a worker's leases are bound to its key).
func WithAPIKey(key string) Option { return func(c *Client) { c.apiKey = key } }

// WithHTTPClient sends requests with hc instead of the client's own. Its Timeout should be
// zero: the Client bounds each request itself (WithTimeout), long-polls included.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.httpClient = hc } }

// WithTimeout bounds each request (default 30 s); a long-poll gets its wait on top.
func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// WithMaxRetries sets how many times a transiently failing request is sent again (default 4).
func WithMaxRetries(n int) Option { return func(c *Client) { c.maxRetries = n } }

// WithLogger sends the client's log lines to l (default: the standard logger's output,
// prefixed "jobq: "). log.New(io.Discard, "", 0) silences them.
func WithLogger(l Logger) Option { return func(c *Client) { c.logger = l } }

// NewClient answers a client of the service at baseURL (e.g. "http://127.0.0.1:8000").
func NewClient(baseURL string, opts ...Option) *Client {
	c := &Client{
		baseURL:    strings.TrimRight(baseURL, "/"),
		timeout:    defaultTimeout,
		maxRetries: defaultMaxRetries,
	}
	for _, opt := range opts {
		opt(c)
	}
	if c.httpClient == nil {
		transport := http.DefaultTransport.(*http.Transport).Clone()
		// A worker keeps a long-poll, a heartbeat and one settle per handler in flight.
		transport.MaxIdleConnsPerHost = 64
		c.httpClient = &http.Client{Transport: transport}
	}
	if c.logger == nil {
		c.logger = log.New(os.Stderr, "jobq: ", log.LstdFlags)
	}
	if c.maxRetries < 0 {
		c.maxRetries = 0
	}
	return c
}

func (c *Client) logf(format string, args ...any) { c.logger.Printf(format, args...) }

// request is one call of the API.
type request struct {
	method string
	path   string
	query  url.Values
	body   any
	// resend: sending the request twice does no harm (the service answers a repeat as it
	// answered the first), so it may be sent again after a broken connection or a 5xx.
	resend bool
	// noRetry: the caller repeats failed calls itself (with its own deadline).
	noRetry bool
	// poll: the answer may take this long on top of the usual (a long-poll's wait).
	poll time.Duration
}

// do sends r, retrying as the Client's documentation says, and decodes the answer into out.
func (c *Client) do(ctx context.Context, r request, out any) error {
	var payload []byte
	if r.body != nil {
		var err error
		if payload, err = json.Marshal(r.body); err != nil {
			return fmt.Errorf("jobq: encoding the request: %w", err)
		}
	}
	tries := 1 + c.maxRetries
	if r.noRetry {
		tries = 1
	}
	var b backoff
	for attempt := 1; ; attempt++ {
		err := c.send(ctx, r, payload, out)
		if err == nil || ctx.Err() != nil || attempt >= tries || !c.retryable(r, err) {
			return err
		}
		delay := retryDelay(err, &b)
		if delay > maxRetryAfter {
			return err
		}
		if deadline, ok := ctx.Deadline(); ok && time.Now().Add(delay).After(deadline) {
			return err
		}
		c.logf("%s %s failed (%v); sending it again in %s", r.method, r.path, err, delay.Round(time.Millisecond))
		if sleep(ctx, delay) != nil {
			return err
		}
	}
}

// retryable reports whether r may be sent again after failing with err.
func (c *Client) retryable(r request, err error) bool {
	var apiErr *Error
	if errors.As(err, &apiErr) {
		// 429: refused before doing anything, so safe to repeat whatever the request.
		return apiErr.Status == http.StatusTooManyRequests || (r.resend && apiErr.Transient())
	}
	if notSent(err) {
		return true
	}
	// A broken connection after the request went out: the service may have done the work
	// and the answer was lost (or, on a reused connection, the keep-alive race: the server
	// closed it as the request was sent). Only a request safe to send twice goes again.
	return r.resend && isTransient(err)
}

// send makes one HTTP exchange.
func (c *Client) send(ctx context.Context, r request, payload []byte, out any) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout+r.poll)
	defer cancel()
	target := c.baseURL + r.path
	if len(r.query) > 0 {
		target += "?" + r.query.Encode()
	}
	var body io.Reader
	if payload != nil {
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, target, body)
	if err != nil {
		return fmt.Errorf("jobq: %w", err)
	}
	req.Header.Set("User-Agent", userAgent)
	req.Header.Set("Accept", "application/json")
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	resp, err := c.httpClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		text, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return newError(resp.StatusCode, resp.Header, text)
	}
	text, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return decodeJSON(text, out)
}

// newIdempotencyKey makes the key of one logical enqueue: every send of it carries the same
// key, so however often it goes out, one job exists.
func newIdempotencyKey() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("jobq: no randomness for an idempotency key: " + err.Error())
	}
	return "auto:" + base64.RawURLEncoding.EncodeToString(b[:])
}

// -- producers ------------------------------------------------------------------------------

// Enqueue enqueues one job and answers it; an idempotent repeat (same IdempotencyKey, same
// request) answers the job the first one created. Without an IdempotencyKey the call makes
// one of its own and sends it with every try, so a request repeated after a dropped
// connection still creates one job.
func (c *Client) Enqueue(ctx context.Context, params EnqueueParams) (*Job, error) {
	body, err := params.body()
	if err != nil {
		return nil, err
	}
	if body.IdempotencyKey == "" {
		body.IdempotencyKey = newIdempotencyKey()
	}
	var job Job
	err = c.do(ctx, request{method: http.MethodPost, path: "/v1/jobs", body: body, resend: true}, &job)
	if err != nil {
		return nil, err
	}
	return &job, nil
}

// EnqueueBatch enqueues many jobs in one transaction (all or none; at most 1,000) and
// answers them in order. Each job without an IdempotencyKey gets one of its own, as in
// Enqueue. callback, when not nil, adds a job that waits for the whole batch.
func (c *Client) EnqueueBatch(ctx context.Context, jobs []EnqueueParams, callback *BatchCallback) (*Batch, error) {
	type callbackBody struct {
		enqueueBody
		When string `json:"when,omitempty"`
	}
	var body struct {
		Jobs     []enqueueBody `json:"jobs"`
		Callback *callbackBody `json:"callback,omitempty"`
	}
	body.Jobs = make([]enqueueBody, len(jobs))
	for i := range jobs {
		item, err := jobs[i].body()
		if err != nil {
			return nil, fmt.Errorf("jobq: batch item %d: %w", i, err)
		}
		if item.IdempotencyKey == "" {
			item.IdempotencyKey = newIdempotencyKey()
		}
		body.Jobs[i] = item
	}
	if callback != nil {
		item, err := callback.body()
		if err != nil {
			return nil, fmt.Errorf("jobq: batch callback: %w", err)
		}
		if item.IdempotencyKey == "" {
			item.IdempotencyKey = newIdempotencyKey()
		}
		body.Callback = &callbackBody{item, callback.When}
	}
	var batch Batch
	err := c.do(ctx, request{method: http.MethodPost, path: "/v1/jobs/batch", body: body, resend: true}, &batch)
	if err != nil {
		return nil, err
	}
	return &batch, nil
}

// GetJob answers one job (a 404 *Error when it does not exist).
func (c *Client) GetJob(ctx context.Context, id int64) (*Job, error) {
	var job Job
	if err := c.do(ctx, request{method: http.MethodGet, path: jobPath(id, ""), resend: true}, &job); err != nil {
		return nil, err
	}
	return &job, nil
}

// Cancel cancels a job that has not finished; a running job's lease ends at once (its worker
// learns it at its next heartbeat). Answers the job; a 409 *Error when its state does not
// allow it.
func (c *Client) Cancel(ctx context.Context, id int64) (*Job, error) {
	var job Job
	if err := c.do(ctx, request{method: http.MethodPost, path: jobPath(id, "/cancel")}, &job); err != nil {
		return nil, err
	}
	return &job, nil
}

// Retry puts a dead, cancelled or succeeded job back to pending; answers it (a 409 *Error
// when its state does not allow it).
func (c *Client) Retry(ctx context.Context, id int64) (*Job, error) {
	var job Job
	if err := c.do(ctx, request{method: http.MethodPost, path: jobPath(id, "/retry")}, &job); err != nil {
		return nil, err
	}
	return &job, nil
}

// ListParams filters a job listing; zero fields do not filter.
type ListParams struct {
	Queue  string
	Status Status // or "retrying": scheduled jobs waiting out a retry's backoff
	Type   string
	Limit  int    // page size, 1 to 500 (default 50)
	After  string // the previous page's NextCursor
}

// JobPage is one page of a job listing, newest first.
type JobPage struct {
	Jobs       []*Job `json:"jobs"`
	NextCursor string `json:"next_cursor"` // "" on the last page
}

// ListJobs answers one page of jobs, newest first (keyset pagination: pass NextCursor as
// After for the next page).
func (c *Client) ListJobs(ctx context.Context, p ListParams) (*JobPage, error) {
	query := url.Values{}
	for name, value := range map[string]string{"queue": p.Queue, "status": string(p.Status), "type": p.Type, "after": p.After} {
		if value != "" {
			query.Set(name, value)
		}
	}
	if p.Limit > 0 {
		query.Set("limit", strconv.Itoa(p.Limit))
	}
	var page JobPage
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/jobs", query: query, resend: true}, &page); err != nil {
		return nil, err
	}
	return &page, nil
}

// JobEvent is one entry of a job's history.
type JobEvent struct {
	ID      int64           `json:"id"`
	At      time.Time       `json:"at"`
	Kind    string          `json:"kind"` // enqueued, claimed, progress, released, failed, ...
	Attempt int             `json:"attempt"`
	Actor   string          `json:"actor"`
	Data    json.RawMessage `json:"data"` // a failure's {"type", "error", "traceback", ...}
}

// JobEvents answers a job's history, oldest first (up to the service's page of 500 events).
func (c *Client) JobEvents(ctx context.Context, id int64) ([]JobEvent, error) {
	var page struct {
		Events []JobEvent `json:"events"`
	}
	r := request{method: http.MethodGet, path: jobPath(id, "/events"), query: url.Values{"limit": {"500"}}, resend: true}
	if err := c.do(ctx, r, &page); err != nil {
		return nil, err
	}
	return page.Events, nil
}

func jobPath(id int64, suffix string) string {
	return "/v1/jobs/" + strconv.FormatInt(id, 10) + suffix
}
