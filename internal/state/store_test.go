package state_test

import (
	"context"
	"errors"
	"testing"
	"time"

	dapr "github.com/dapr/go-sdk/client"

	"github.com/virtufin/workmanager/internal/devstack"
	"github.com/virtufin/workmanager/internal/state"
)

// runConformance checks the Store contract; every implementation passes it.
func runConformance(t *testing.T, s state.Store) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := state.KeyPrefix + "test/" + t.Name()

	if _, err := s.Get(ctx, key); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("Get of a missing key: %v, want ErrNotFound", err)
	}
	if err := s.Put(ctx, key, []byte("v1"), state.PutOptions{IfAbsent: true}); err != nil {
		t.Fatalf("first create-if-absent: %v", err)
	}
	if err := s.Put(ctx, key, []byte("v2"), state.PutOptions{IfAbsent: true}); !errors.Is(err, state.ErrConflict) {
		t.Fatalf("second create-if-absent: %v, want ErrConflict", err)
	}
	it, err := s.Get(ctx, key)
	if err != nil || string(it.Value) != "v1" || it.ETag == "" {
		t.Fatalf("Get: %q %q %v", it.Value, it.ETag, err)
	}
	if err := s.Put(ctx, key, []byte("v2"), state.PutOptions{ETag: it.ETag}); err != nil {
		t.Fatalf("put with current etag: %v", err)
	}
	if err := s.Put(ctx, key, []byte("v3"), state.PutOptions{ETag: it.ETag}); !errors.Is(err, state.ErrConflict) {
		t.Fatalf("put with stale etag: %v, want ErrConflict", err)
	}
	plain := key + "/plain"
	for _, v := range []string{"v1", "v2"} {
		if err := s.Put(ctx, plain, []byte(v), state.PutOptions{}); err != nil {
			t.Fatalf("unconditional put: %v", err)
		}
	}
	if it, _ = s.Get(ctx, plain); string(it.Value) != "v2" {
		t.Fatalf("value %q", it.Value)
	}
	if err := s.Delete(ctx, key, ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, key, ""); err != nil {
		t.Fatalf("deleting a missing key: %v", err)
	}
	if _, err := s.Get(ctx, key); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("Get after delete: %v", err)
	}
}

func TestMemoryStore(t *testing.T) { runConformance(t, state.NewMemoryStore()) }

// TestDaprStore runs the same contract on real daprd with state.redis.
func TestDaprStore(t *testing.T) {
	_, conn := devstack.StartT(t, devstack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := state.NewDaprStore(dapr.NewClientWithConnection(conn), devstack.StateName)
	runConformance(t, s)

	// TTL: a staged key expires.
	key := state.KeyPrefix + "test/ttl"
	if err := s.Put(ctx, key, []byte("x"), state.PutOptions{TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := s.Get(ctx, key); errors.Is(err, state.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("key with a 1s TTL still there after 10s")
		}
		time.Sleep(200 * time.Millisecond)
	}
}
