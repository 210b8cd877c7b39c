package jobq

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

type parseError struct{ line int }

func (e *parseError) Error() string { return fmt.Sprintf("line %d: bad syntax", e.line) }

type namedError struct{}

func (namedError) Error() string     { return "named" }
func (namedError) ErrorType() string { return "billing.CardDeclined" }

func TestErrorTypeName(t *testing.T) {
	_, pathErr := os.Open("/does/not/exist")
	cases := []struct {
		err  error
		want string
	}{
		{errors.New("plain"), "error"},
		{fmt.Errorf("no wrap: %v", 1), "error"},
		{&parseError{3}, "jobq.parseError"},
		{fmt.Errorf("loading config: %w", &parseError{3}), "jobq.parseError"},
		{WithStack(NonRetryable(&parseError{3})), "jobq.parseError"},
		{RetryAfter(fmt.Errorf("ctx: %w", pathErr), time.Second), "fs.PathError"},
		{fmt.Errorf("wrapped: %w", namedError{}), "billing.CardDeclined"},
		{&PanicError{Value: "boom"}, "panic"},
		{&PanicError{Value: &parseError{1}}, "jobq.parseError"},
	}
	for _, tc := range cases {
		if got := errorTypeName(tc.err); got != tc.want {
			t.Errorf("errorTypeName(%#v) = %q, want %q", tc.err, got, tc.want)
		}
	}
	if !errors.Is(pathErr, fs.ErrNotExist) {
		t.Fatal("sanity")
	}
}

func failHere() error { return WithStack(&parseError{7}) }

func TestWithStackRecordsWhereItWasCalled(t *testing.T) {
	err := failHere()
	if err.Error() != "line 7: bad syntax" {
		t.Errorf("message = %q", err.Error())
	}
	var pe *parseError
	if !errors.As(err, &pe) || pe.line != 7 {
		t.Errorf("WithStack hides the error it wraps")
	}
	if WithStack(err) != err {
		t.Errorf("a second WithStack replaced the first stack")
	}
	if WithStack(nil) != nil {
		t.Errorf("WithStack(nil) is not nil")
	}
	detail := errorDetail(fmt.Errorf("parsing: %w", err))
	if detail.Type != "jobq.parseError" || detail.Message != "parsing: line 7: bad syntax" || detail.Traceback == nil {
		t.Fatalf("detail = %+v", detail)
	}
	tb := *detail.Traceback
	first := strings.SplitN(tb, "\n\n", 2)
	if len(first) != 2 || !strings.HasPrefix(first[1], "github.com/jobq/jobq/clients/go.failHere(") {
		t.Errorf("the stack does not start in failHere:\n%s", tb)
	}
	if !strings.Contains(tb, "failure_test.go:") {
		t.Errorf("the stack names no file:\n%s", tb)
	}
	if plus := fmt.Sprintf("%+v", err); !strings.Contains(plus, "failHere") {
		t.Errorf("%%+v prints no stack: %s", plus)
	}
	if plain := fmt.Sprintf("%v", err); plain != "line 7: bad syntax" {
		t.Errorf("%%v = %q", plain)
	}
}

func TestErrorDetailWithoutStack(t *testing.T) {
	detail := errorDetail(errors.New("nope"))
	if detail.Type != "error" || detail.Message != "nope" || detail.Traceback != nil {
		t.Errorf("detail = %+v", detail)
	}
	long := errorDetail(errors.New(strings.Repeat("x", errorTextMaxChars+10)))
	if len(long.Message) != errorTextMaxChars {
		t.Errorf("message not cut: %d chars", len(long.Message))
	}
}

func TestPanicDetail(t *testing.T) {
	var err error
	func() {
		defer func() {
			if v := recover(); v != nil {
				err = newPanicError(v, debug.Stack())
			}
		}()
		var m map[string]int
		m["x"] = 1 // panics: assignment to entry in nil map
	}()
	detail := errorDetail(err)
	if !strings.HasPrefix(detail.Type, "runtime.") {
		t.Errorf("type = %q, want the runtime error's", detail.Type)
	}
	if !strings.Contains(detail.Message, "nil map") || detail.Traceback == nil ||
		!strings.HasPrefix(*detail.Traceback, "panic: assignment to entry in nil map") ||
		!strings.Contains(*detail.Traceback, "TestPanicDetail") || strings.Contains(*detail.Traceback, "debug.Stack") {
		t.Errorf("detail = %+v", detail)
	}
}

func TestMarkers(t *testing.T) {
	base := errors.New("x")
	if !IsNonRetryable(fmt.Errorf("a: %w", NonRetryable(base))) || IsNonRetryable(base) {
		t.Error("IsNonRetryable")
	}
	if !errors.Is(NonRetryable(base), base) || NonRetryable(nil) != nil || RetryAfter(nil, time.Second) != nil {
		t.Error("wrappers")
	}
	if d := retryAfterOf(fmt.Errorf("a: %w", RetryAfter(base, 1500*time.Millisecond))); d == nil || *d != 1.5 {
		t.Errorf("retryAfterOf = %v", d)
	}
}
