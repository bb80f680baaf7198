package codesource_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/virtufin/workmanager/internal/codesource"
)

// wantRefusal asserts err is a *Refusal with rule, ErrForbidden and not
// ErrInvalid, whose message contains every string of want.
func wantRefusal(t *testing.T, err error, rule string, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want a refusal by rule %s", rule)
	}
	if !errors.Is(err, codesource.ErrForbidden) || errors.Is(err, codesource.ErrInvalid) {
		t.Errorf("%v: want ErrForbidden only (forbidden=%v invalid=%v)", err,
			errors.Is(err, codesource.ErrForbidden), errors.Is(err, codesource.ErrInvalid))
	}
	var r *codesource.Refusal
	if !errors.As(err, &r) {
		t.Fatalf("%v: not a *Refusal", err)
	}
	if r.Rule != rule {
		t.Errorf("%v: rule %q, want %q", err, r.Rule, rule)
	}
	if !strings.HasPrefix(err.Error(), "code.url refused by rule "+rule+": ") {
		t.Errorf("%v: message does not start with the rule", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%v: want it to contain %q", err, w)
		}
	}
}

// wantInvalid asserts err wraps ErrInvalid, not ErrForbidden, and its
// message contains every string of want.
func wantInvalid(t *testing.T, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatal("no error, want ErrInvalid")
	}
	if !errors.Is(err, codesource.ErrInvalid) || errors.Is(err, codesource.ErrForbidden) {
		t.Errorf("%v: want ErrInvalid only", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%v: want it to contain %q", err, w)
		}
	}
}

// wantRetryable asserts err is neither ErrInvalid nor ErrForbidden.
func wantRetryable(t *testing.T, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatal("no error, want a retryable one")
	}
	if errors.Is(err, codesource.ErrInvalid) || errors.Is(err, codesource.ErrForbidden) {
		t.Errorf("%v: want neither ErrInvalid nor ErrForbidden", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%v: want it to contain %q", err, w)
		}
	}
}

// wantAbsent asserts err's message contains none of the strings.
func wantAbsent(t *testing.T, err error, absent ...string) {
	t.Helper()
	for _, a := range absent {
		if err != nil && strings.Contains(err.Error(), a) {
			t.Errorf("%v: must not contain %q", err, a)
		}
	}
}
