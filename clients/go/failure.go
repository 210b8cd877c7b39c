package jobq

import (
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"strings"
)

// The service's limits on a fail item's error (see ErrorDetail in openapi.json).
const (
	errorTypeMaxChars = 200
	errorTextMaxChars = 65536
	// The service keeps the last 16000 characters of a traceback; a Go stack lists its
	// innermost frame first, so the client cuts it itself, keeping the head.
	tracebackMaxChars = 16000
	maxStackDepth     = 64
)

// ErrorDetail is a handler's failure as POST /v1/fail records it: the error's type name, its
// message and its stack trace. The job keeps "type: message" as its last_error; the traceback
// is kept in the job's history (GET /v1/jobs/{id}/events).
type ErrorDetail struct {
	Type      string  `json:"type"`
	Message   string  `json:"message"`
	Traceback *string `json:"traceback,omitempty"`
}

// ErrorTyper is implemented by errors that name their own type for the service; otherwise the
// type is the Go type's name as %T prints it, without the pointer (e.g. "os.PathError").
type ErrorTyper interface {
	ErrorType() string
}

// WithStack records the call stack where it is called in err, so a handler's failure shows
// where it happened (Go errors carry no stack of their own). It answers nil for nil, and err
// unchanged when err already carries a stack. The result's Error() is err's, and it wraps err
// for errors.Is / errors.As; "%+v" prints the message followed by the stack.
//
//	return nil, jobq.WithStack(fmt.Errorf("charging %s: %w", order, err))
func WithStack(err error) error {
	if err == nil {
		return nil
	}
	var s *stackError
	if errors.As(err, &s) {
		return err
	}
	pcs := make([]uintptr, maxStackDepth)
	n := runtime.Callers(2, pcs) // skip runtime.Callers and WithStack
	return &stackError{err: err, pcs: pcs[:n]}
}

type stackError struct {
	err error
	pcs []uintptr
}

func (e *stackError) Error() string { return e.err.Error() }
func (e *stackError) Unwrap() error { return e.err }

// Format prints the message for %s and %v, and the message and the stack for %+v.
func (e *stackError) Format(f fmt.State, verb rune) {
	switch {
	case verb == 'v' && f.Flag('+'):
		fmt.Fprintf(f, "%s\n%s", e.err.Error(), e.stack())
	case verb == 'q':
		fmt.Fprintf(f, "%q", e.err.Error())
	default:
		fmt.Fprint(f, e.err.Error())
	}
}

// stack formats the recorded frames the way a Go panic prints them.
func (e *stackError) stack() string {
	var b strings.Builder
	frames := runtime.CallersFrames(e.pcs)
	for {
		frame, more := frames.Next()
		fmt.Fprintf(&b, "%s(...)\n\t%s:%d\n", frame.Function, frame.File, frame.Line)
		if !more {
			break
		}
	}
	return b.String()
}

// newPanicError records a recovered panic with the stack of the goroutine that panicked,
// from the panicking frame down: debug.Stack's own frames, the recovering function's and
// the runtime's panic are cut, so the stack reads as an unrecovered panic's does.
func newPanicError(value any, stack []byte) *PanicError {
	lines := strings.Split(string(stack), "\n")
	for i := 1; i+1 < len(lines); i++ {
		if strings.HasPrefix(lines[i], "panic(") {
			// lines[0] is "goroutine N [running]:"; lines[i+1] the file of panic().
			kept := append([]string{lines[0]}, lines[i+2:]...)
			stack = []byte(strings.Join(kept, "\n"))
			break
		}
	}
	return &PanicError{Value: value, Stack: stack}
}

// PanicError is a panic recovered in a handler: the job fails with it (retryable, unless the
// panic's value is an error marked NonRetryable) and its traceback is the panicking
// goroutine's stack.
type PanicError struct {
	Value any    // what the handler panicked with
	Stack []byte // debug.Stack() where the panic was recovered
}

func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v", e.Value) }

// Unwrap answers the panic's value when it is an error.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// ErrorType names the panic's value's type when it is an error, else "panic".
func (e *PanicError) ErrorType() string {
	if err, ok := e.Value.(error); ok {
		return errorTypeName(err)
	}
	return "panic"
}

// errorDetail describes a handler's error as POST /v1/fail takes it.
func errorDetail(err error) ErrorDetail {
	detail := ErrorDetail{Type: errorTypeName(err), Message: err.Error()}
	var p *PanicError
	if errors.As(err, &p) {
		detail.Message = fmt.Sprint(p.Value)
	}
	if len(detail.Type) > errorTypeMaxChars {
		detail.Type = detail.Type[len(detail.Type)-errorTypeMaxChars:]
	}
	if len(detail.Message) > errorTextMaxChars {
		detail.Message = detail.Message[:errorTextMaxChars]
	}
	if tb := traceback(err); tb != "" {
		if len(tb) > tracebackMaxChars {
			tb = tb[:tracebackMaxChars]
		}
		detail.Traceback = &tb
	}
	return detail
}

// traceback is the stack an error carries: a recovered panic's, one recorded by WithStack, or
// what "%+v" prints of an error type that formats its own stack (github.com/pkg/errors and
// the like). Empty when it carries none.
func traceback(err error) string {
	var p *PanicError
	if errors.As(err, &p) {
		return fmt.Sprintf("panic: %v\n\n%s", p.Value, p.Stack)
	}
	var s *stackError
	if errors.As(err, &s) {
		return fmt.Sprintf("%s: %s\n\n%s", errorTypeName(err), err.Error(), s.stack())
	}
	var f fmt.Formatter
	if errors.As(err, &f) {
		if text := fmt.Sprintf("%+v", f); text != fmt.Sprint(f) {
			return text
		}
	}
	return ""
}

// errorTypeName names an error's type for the service: ErrorType() of the first error in the
// chain that has one, else the type of the first error that is not just a wrapper (this
// package's, or fmt.Errorf's %w), as %T prints it without the pointer. errors.New's and
// fmt.Errorf's plain errors are named "error".
func errorTypeName(err error) string {
	var typer ErrorTyper
	if errors.As(err, &typer) {
		if name := typer.ErrorType(); name != "" {
			return name
		}
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		if isWrapper(e) && errors.Unwrap(e) != nil {
			continue
		}
		return typeName(e)
	}
	return typeName(err)
}

// isWrapper reports whether e only adds context to the error it wraps: its type says
// nothing of what went wrong.
func isWrapper(e error) bool {
	switch e.(type) {
	case *stackError, *nonRetryableError, *retryAfterError:
		return true
	}
	return reflect.TypeOf(e).String() == "*fmt.wrapError"
}

func typeName(e error) string {
	t := reflect.TypeOf(e)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	name := t.String()
	switch name {
	case "errors.errorString", "fmt.wrapError":
		return "error"
	case "":
		return strings.TrimLeft(fmt.Sprintf("%T", e), "*")
	}
	return name
}
