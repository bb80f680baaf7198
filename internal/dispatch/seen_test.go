package dispatch

import (
	"errors"
	"strconv"
	"testing"
	"time"
)

// A signature is taken once; again within twice forwardMaxAge it is a
// replay; after that it is forgotten (the request itself is too old by
// then). Past maxSeenSignatures nothing new is taken until old ones expire.
func TestSeenSignaturesRefuseReplaysAndStayBounded(t *testing.T) {
	s := &seenSignatures{at: map[string]time.Time{}}
	now := time.Unix(1_700_000_000, 0)
	if err := s.add("a", now); err != nil {
		t.Fatal(err)
	}
	if err := s.add("a", now.Add(forwardMaxAge)); !errors.Is(err, errReplayed) {
		t.Fatalf("again within the window: %v, want errReplayed", err)
	}
	if err := s.add("a", now.Add(3*forwardMaxAge)); err != nil {
		t.Fatalf("after twice the window: %v", err)
	}
	for i := len(s.at); i < maxSeenSignatures; i++ {
		s.at[strconv.Itoa(i)] = now.Add(3 * forwardMaxAge)
	}
	if err := s.add("new", now.Add(3*forwardMaxAge)); !errors.Is(err, errTooMany) {
		t.Fatalf("full: %v, want errTooMany", err)
	}
	if err := s.add("new", now.Add(6*forwardMaxAge)); err != nil || len(s.at) != 1 {
		t.Fatalf("once the old ones expired: %v, %d remembered", err, len(s.at))
	}
}
