// Command jobq-contract-driver is the Go client's driver for the clients' contract suite
// (clients/CONTRACT.md): a small program built only on the client's public API, which the
// suite starts, signals, kills and reads.
//
//	jobq-contract-driver enqueue '{"type": "echo", "payload": {...}}'
//	jobq-contract-driver workflow '{"name": "w", "steps": [{"name": "a", "type": "echo"}]}'
//	jobq-contract-driver wait <job_id> <timeout_seconds>
//	jobq-contract-driver worker
//
// It reads JOBQ_URL, JOBQ_API_KEY and JOBQ_QUEUE (and the worker's settings) from the
// environment, prints one JSON object per line on stdout and its diagnostics on stderr.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	jobq "github.com/jobq/jobq/clients/go"
)

var stdout sync.Mutex

// emit prints one JSON line at once (os.Stdout is unbuffered: one write per line).
func emit(v any) {
	line, err := json.Marshal(v)
	if err != nil {
		log.Fatalf("encoding %v: %v", v, err)
	}
	stdout.Lock()
	defer stdout.Unlock()
	_, _ = os.Stdout.Write(append(line, '\n'))
}

func main() {
	log.SetPrefix("jobq-contract-driver: ")
	log.SetOutput(os.Stderr)
	if len(os.Args) < 2 {
		log.Fatal("usage: jobq-contract-driver enqueue <json> | workflow <json> | wait <job_id> <timeout_seconds> | worker")
	}
	baseURL, queue := os.Getenv("JOBQ_URL"), os.Getenv("JOBQ_QUEUE")
	if baseURL == "" || queue == "" {
		log.Fatal("JOBQ_URL and JOBQ_QUEUE must be set")
	}
	opts := []jobq.Option{jobq.WithLogger(log.New(os.Stderr, "jobq: ", log.LstdFlags|log.Lmicroseconds))}
	if key := os.Getenv("JOBQ_API_KEY"); key != "" {
		opts = append(opts, jobq.WithAPIKey(key))
	}
	client := jobq.NewClient(baseURL, opts...)
	var err error
	switch cmd := os.Args[1]; {
	case cmd == "enqueue" && len(os.Args) == 3:
		err = enqueue(client, queue, os.Args[2])
	case cmd == "workflow" && len(os.Args) == 3:
		err = createWorkflow(client, queue, os.Args[2])
	case cmd == "wait" && len(os.Args) == 4:
		err = wait(client, os.Args[2], os.Args[3])
	case cmd == "worker" && len(os.Args) == 2:
		err = work(client, queue)
	default:
		err = fmt.Errorf("unknown command or wrong arguments: %q", os.Args[1:])
	}
	if err != nil {
		log.Fatal(err)
	}
}

// reportAPIError prints an error answer the client does not retry; false for other errors.
func reportAPIError(err error) bool {
	var apiErr *jobq.Error
	if !errors.As(err, &apiErr) {
		return false
	}
	emit(map[string]any{"ok": false, "status": apiErr.Status, "problem": apiErr.Problem})
	return true
}

func enqueue(client *jobq.Client, queue, arg string) error {
	var spec struct {
		Type           string          `json:"type"`
		Payload        json.RawMessage `json:"payload"`
		IdempotencyKey string          `json:"idempotency_key"`
		MaxAttempts    int             `json:"max_attempts"`
	}
	if err := json.Unmarshal([]byte(arg), &spec); err != nil {
		return fmt.Errorf("enqueue: bad JSON argument: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	job, err := client.Enqueue(ctx, jobq.EnqueueParams{
		Queue:          queue,
		Type:           spec.Type,
		Payload:        spec.Payload,
		IdempotencyKey: spec.IdempotencyKey,
		MaxAttempts:    spec.MaxAttempts,
	})
	if err != nil {
		if reportAPIError(err) {
			return nil
		}
		return err
	}
	emit(map[string]any{"ok": true, "job": job.Raw})
	return nil
}

func createWorkflow(client *jobq.Client, queue, arg string) error {
	var spec struct {
		Name           string `json:"name"`
		IdempotencyKey string `json:"idempotency_key"`
		Steps          []struct {
			Name    string          `json:"name"`
			Type    string          `json:"type"`
			Payload json.RawMessage `json:"payload"`
			After   []string        `json:"after"`
		} `json:"steps"`
	}
	if err := json.Unmarshal([]byte(arg), &spec); err != nil {
		return fmt.Errorf("workflow: bad JSON argument: %w", err)
	}
	steps := make([]jobq.Step, len(spec.Steps))
	for i, s := range spec.Steps {
		steps[i] = jobq.Step{
			Name:          s.Name,
			After:         s.After,
			EnqueueParams: jobq.EnqueueParams{Queue: queue, Type: s.Type, Payload: s.Payload},
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wf, err := client.CreateWorkflowWithKey(ctx, spec.Name, spec.IdempotencyKey, steps)
	if err != nil {
		if reportAPIError(err) {
			return nil
		}
		return err
	}
	emit(map[string]any{"ok": true, "workflow": wf})
	return nil
}

func wait(client *jobq.Client, idArg, timeoutArg string) error {
	id, err := strconv.ParseInt(idArg, 10, 64)
	if err != nil {
		return fmt.Errorf("wait: bad job id: %w", err)
	}
	seconds, err := strconv.ParseFloat(timeoutArg, 64)
	if err != nil {
		return fmt.Errorf("wait: bad timeout: %w", err)
	}
	job, err := client.Wait(context.Background(), id, time.Duration(seconds*float64(time.Second)))
	switch {
	case errors.Is(err, jobq.ErrWaitTimeout):
		emit(map[string]any{"ok": false, "timeout": true})
		return nil
	case err != nil:
		if reportAPIError(err) {
			return nil
		}
		return err
	}
	emit(map[string]any{"ok": true, "job": job.Raw})
	return nil
}

func work(client *jobq.Client, queue string) error {
	cfg := jobq.WorkerConfig{
		Queues:            []string{queue},
		WorkerID:          os.Getenv("JOBQ_WORKER_ID"),
		Concurrency:       int(envFloat("JOBQ_CONCURRENCY", 1)),
		Lease:             envSeconds("JOBQ_LEASE_SECONDS", 30),
		Grace:             envSeconds("JOBQ_GRACE_SECONDS", 10),
		PollWait:          envSeconds("JOBQ_WAIT_SECONDS", 2),
		HeartbeatInterval: envSeconds("JOBQ_HEARTBEAT_SECONDS", 0), // 0: a third of the lease
	}
	worker, err := jobq.NewWorker(client, cfg)
	if err != nil {
		return err
	}
	handlers := map[string]jobq.HandlerFunc{
		"echo": echo, "noop": noop, "sleep1ms": sleep1ms, "boom": boom, "chunked": chunked, "hang": hang,
	}
	for name, handler := range handlers {
		worker.Handle(name, started(handler))
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		// A second signal ends the grace period (the first one's context stays registered,
		// so no signal kills the process meanwhile).
		<-ctx.Done()
		again := make(chan os.Signal, 1)
		signal.Notify(again, syscall.SIGTERM, syscall.SIGINT)
		<-again
		worker.Stop()
	}()
	emit(event{"ready"})
	err = worker.Run(ctx)
	emit(event{"stopped"})
	return err
}

// envSeconds reads a duration in seconds; zero stays zero only for the heartbeat (the
// worker's "default"): elsewhere it means "none", which WorkerConfig spells negative.
func envSeconds(name string, def float64) time.Duration {
	seconds := envFloat(name, def)
	if seconds == 0 && name != "JOBQ_HEARTBEAT_SECONDS" {
		return -1
	}
	return time.Duration(seconds * float64(time.Second))
}

func envFloat(name string, def float64) float64 {
	text := os.Getenv(name)
	if text == "" {
		return def
	}
	value, err := strconv.ParseFloat(text, 64)
	if err != nil {
		log.Fatalf("%s: %v", name, err)
	}
	return value
}

// Event lines are structs, not maps, so "event" comes first, as readers of the lines expect.
type event struct {
	Event string `json:"event"`
}

type jobEvent struct {
	Event string `json:"event"`
	JobID int64  `json:"job_id"`
}

type startedEvent struct {
	Event      string          `json:"event"`
	JobID      int64           `json:"job_id"`
	Type       string          `json:"type"`
	Attempt    int             `json:"attempt"`
	Checkpoint json.RawMessage `json:"checkpoint"`
}

// -- handlers -------------------------------------------------------------------------------

// started prints the "started" event before running the handler.
func started(next jobq.HandlerFunc) jobq.HandlerFunc {
	return func(ctx context.Context, jc *jobq.JobContext) (any, error) {
		checkpoint := jc.Job.Checkpoint
		if checkpoint == nil {
			checkpoint = json.RawMessage("null")
		}
		emit(startedEvent{"started", jc.Job.ID, jc.Job.Type, jc.Job.Attempt, checkpoint})
		return next(ctx, jc)
	}
}

func aborted(jc *jobq.JobContext) {
	emit(jobEvent{"aborted", jc.Job.ID})
}

func echo(ctx context.Context, jc *jobq.JobContext) (any, error) {
	payload := jc.Job.Payload
	if payload == nil {
		payload = json.RawMessage("null")
	}
	return map[string]any{"echo": payload}, nil
}

func noop(ctx context.Context, jc *jobq.JobContext) (any, error) {
	return nil, nil
}

func sleep1ms(ctx context.Context, jc *jobq.JobContext) (any, error) {
	time.Sleep(time.Millisecond)
	return nil, nil
}

// ContractBoom is the error the boom handler fails with.
type ContractBoom struct{ Message string }

func (e *ContractBoom) Error() string { return e.Message }

// boom fails with a ContractBoom whose stack is captured here, so the recorded traceback
// names this function.
func boom(ctx context.Context, jc *jobq.JobContext) (any, error) {
	var payload struct {
		Message string `json:"message"`
	}
	if err := jc.DecodePayload(&payload); err != nil {
		return nil, err
	}
	return nil, jobq.WithStack(&ContractBoom{Message: payload.Message})
}

// chunked does payload.chunks chunks of payload.chunk_seconds each, from the checkpoint on,
// saving the checkpoint after each.
func chunked(ctx context.Context, jc *jobq.JobContext) (any, error) {
	var payload struct {
		Chunks       int     `json:"chunks"`
		ChunkSeconds float64 `json:"chunk_seconds"`
	}
	if err := jc.DecodePayload(&payload); err != nil {
		return nil, jobq.NonRetryable(err)
	}
	var checkpoint struct {
		Next int `json:"next"`
	}
	if _, err := jc.DecodeCheckpoint(&checkpoint); err != nil {
		return nil, jobq.NonRetryable(err)
	}
	start := checkpoint.Next
	for n := start; n < payload.Chunks; n++ {
		timer := time.NewTimer(time.Duration(payload.ChunkSeconds * float64(time.Second)))
		select {
		case <-ctx.Done():
			timer.Stop()
			aborted(jc)
			return nil, ctx.Err()
		case <-timer.C:
		}
		err := jc.SaveCheckpoint(
			map[string]any{"next": n + 1},
			map[string]any{"done": n + 1, "total": payload.Chunks},
		)
		switch {
		case errors.Is(err, jobq.ErrStopRequested):
			return nil, err // released with the checkpoint just saved
		case err != nil && jc.AbortReason() != nil:
			aborted(jc)
			return nil, err
		case err != nil:
			return nil, err
		}
	}
	return map[string]any{"chunks": payload.Chunks, "resumed_from": start}, nil
}

// hang waits for the job's abort.
func hang(ctx context.Context, jc *jobq.JobContext) (any, error) {
	<-ctx.Done()
	aborted(jc)
	return nil, ctx.Err()
}
