package peeraddr

import (
	"context"
	"errors"
	"testing"
	"time"
)

// An address is looked up once and remembered; a quiet node gets none
// until its quiet time passed, then is looked up again; a forgotten one is
// looked up at once; a failed lookup gives none and is not remembered.
func TestCacheLooksUpOnceQuietsAndForgets(t *testing.T) {
	lookups := 0
	fail := false
	c := New(func(_ context.Context, node string) (string, error) {
		lookups++
		if fail {
			return "", errors.New("store down")
		}
		return node + ":8080", nil
	})
	ctx := context.Background()
	for range 3 {
		if a := c.Addr(ctx, "a"); a != "a:8080" {
			t.Fatalf("Addr: %q", a)
		}
	}
	if lookups != 1 {
		t.Fatalf("%d lookups for three Addr calls, want 1", lookups)
	}
	c.Quiet("a", 20*time.Millisecond)
	if a := c.Addr(ctx, "a"); a != "" || lookups != 1 {
		t.Fatalf("quiet: %q after %d lookups", a, lookups)
	}
	time.Sleep(30 * time.Millisecond)
	if a := c.Addr(ctx, "a"); a != "a:8080" || lookups != 2 {
		t.Fatalf("after the quiet time: %q after %d lookups, want a new one", a, lookups)
	}
	c.Forget("a")
	fail = true
	if a := c.Addr(ctx, "a"); a != "" || lookups != 3 {
		t.Fatalf("forgotten, lookup failing: %q after %d lookups", a, lookups)
	}
	fail = false
	if a := c.Addr(ctx, "a"); a != "a:8080" || lookups != 4 {
		t.Fatalf("a failed lookup is not remembered: %q after %d lookups", a, lookups)
	}
}

// A node made quiet while its address was being looked up (a request to
// it failed meanwhile) stays quiet: the lookup's answer does not undo it.
func TestQuietDuringALookupStays(t *testing.T) {
	var c *Cache
	c = New(func(_ context.Context, node string) (string, error) {
		c.Quiet(node, time.Minute) // another message's request to it fails now
		return node + ":8080", nil
	})
	ctx := context.Background()
	if a := c.Addr(ctx, "a"); a != "" {
		t.Fatalf("Addr during a failure: %q, want none", a)
	}
	if a := c.Addr(ctx, "a"); a != "" {
		t.Fatalf("Addr after it: %q, want none (the node is quiet for a minute)", a)
	}
}
