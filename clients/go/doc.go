// Package jobq is the Go client of jobq, an HTTP job queue on PostgreSQL.
//
// A Client enqueues jobs (alone, in batches, or as workflows), reads them, waits for their
// results, cancels and retries them, and speaks the raw worker protocol. A Worker claims
// jobs with long-polls, runs a Handler per job type with batched heartbeats, checkpoints and
// a graceful stop, and settles each job (complete, fail or release) in the same request that
// claims its next jobs.
//
// Producer:
//
//	client := jobq.NewClient("http://127.0.0.1:8000", jobq.WithAPIKey(os.Getenv("JOBQ_API_KEY")))
//	job, err := client.Enqueue(ctx, jobq.EnqueueParams{Queue: "emails", Type: "welcome", Payload: map[string]any{"user": 42}})
//
// Worker:
//
//	worker, err := jobq.NewWorker(client, jobq.WorkerConfig{Queues: []string{"emails"}, Concurrency: 8})
//	worker.HandleFunc("welcome", func(ctx context.Context, jc *jobq.JobContext) (any, error) {
//		var p struct{ User int }
//		if err := jc.DecodePayload(&p); err != nil {
//			return nil, jobq.NonRetryable(err)
//		}
//		if err := sendWelcome(ctx, p.User); err != nil {
//			return nil, jobq.WithStack(err) // retried after a backoff
//		}
//		return map[string]any{"sent": true}, nil
//	})
//	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
//	defer stop()
//	err = worker.Run(ctx)
//
// Delivery is at least once: a job whose worker died runs again once its lease expires, so
// handlers must be idempotent; the job's ID (stable across attempts), its Attempt and its
// Checkpoint are there for that.
//
// The package needs only the standard library and Go 1.19.
package jobq
