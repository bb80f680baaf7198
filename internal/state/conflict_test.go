package state

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Only a failed precondition of a conditional write is a conflict; an
// error that merely mentions an ETag, or a failure of a plain write, is an
// error the caller must see.
func TestIsConflictRecognisesOnlyFailedPreconditions(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("error saving state: %w", err) }
	for _, c := range []struct {
		name        string
		err         error
		conditional bool
		want        bool
	}{
		{"etag mismatch", status.Error(codes.Aborted, "failed saving state in state store statestore: possible etag mismatch. error from state store: x"), true, true},
		{"etag mismatch, wrapped by the SDK", wrap(status.Error(codes.Aborted, "possible etag mismatch")), true, true},
		{"first-write finds the key", wrap(status.Error(codes.Internal, "failed saving state in state store statestore: failed to set key app||k: failed to set key app||k")), true, true},
		{"invalid etag", status.Error(codes.InvalidArgument, "failed saving state in state store statestore: invalid etag value: strconv.Atoi: parsing \"x\""), true, false},
		{"ttl not set", status.Error(codes.Internal, "failed saving state in state store statestore: failed to set key app||k ttl: connection refused"), true, false},
		{"store down", status.Error(codes.Internal, "failed saving state in state store statestore: dial tcp: connection refused"), true, false},
		{"unconditional write", status.Error(codes.Aborted, "etag mismatch"), false, false},
		{"not a gRPC error", errors.New("etag mismatch"), true, false},
	} {
		if got := isConflict(c.err, c.conditional); got != c.want {
			t.Errorf("%s: isConflict = %v, want %v", c.name, got, c.want)
		}
	}
}

// alwaysConflicts is a store whose every write loses the race.
type alwaysConflicts struct {
	Store
	puts int
}

func (s *alwaysConflicts) Put(context.Context, string, []byte, PutOptions) error {
	s.puts++
	return fmt.Errorf("put: %w", ErrConflict)
}

// UpdateJSON backs off between conflicts instead of hammering the store:
// in a window where a retry loop without pauses makes thousands of writes,
// it makes a handful (the pauses grow to ConflictBackoffMax), and it stops
// with ctx's error.
func TestUpdateJSONBacksOffOnConflicts(t *testing.T) {
	s := &alwaysConflicts{Store: NewMemoryStore()}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := UpdateJSON(ctx, s, KeyPrefix+"k", func(v *int) bool { *v++; return true })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("UpdateJSON returned %v, want the deadline", err)
	}
	// With full jitter capped at 50 ms the expected count is about 15;
	// without backoff it is in the tens of thousands.
	if s.puts < 2 || s.puts > 200 {
		t.Fatalf("%d writes in 300 ms of conflicts", s.puts)
	}
}
