package state_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
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

// runBulkConformance checks the Bulk contract, and the Store contract
// through a Batching on s.
func runBulkConformance(t *testing.T, s state.Bulk) {
	runConformance(t, state.NewBatching(s, 0))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := state.KeyPrefix + "test/" + t.Name() + "/bulk/"
	if err := s.Put(ctx, key+"a", []byte("a1"), state.PutOptions{IfAbsent: true}); err != nil {
		t.Fatal(err)
	}
	res, err := s.GetMany(ctx, []string{key + "a", key + "none", key + "a"})
	if err != nil || len(res) != 3 || string(res[0].Value) != "a1" || res[0].ETag == "" || res[0].Err != nil ||
		!errors.Is(res[1].Err, state.ErrNotFound) || string(res[2].Value) != "a1" {
		t.Fatalf("GetMany = %+v, %v", res, err)
	}
	etag := res[0].ETag
	if err := s.PutMany(ctx, []state.Write{
		{Key: key + "a", Value: []byte("a2"), Opts: state.PutOptions{ETag: etag}},
		{Key: key + "b", Value: []byte("b1"), Opts: state.PutOptions{IfAbsent: true, TTL: time.Hour}},
	}); err != nil {
		t.Fatalf("PutMany: %v", err)
	}
	res, err = s.GetMany(ctx, []string{key + "a", key + "b"})
	if err != nil || string(res[0].Value) != "a2" || res[0].ETag == etag || string(res[1].Value) != "b1" {
		t.Fatalf("after PutMany: %+v, %v", res, err)
	}
	// A stale ETag fails the call (the other writes may or may not apply).
	if err := s.PutMany(ctx, []state.Write{
		{Key: key + "a", Value: []byte("a3"), Opts: state.PutOptions{ETag: etag}},
		{Key: key + "c", Value: []byte("c1")},
	}); err == nil {
		t.Fatal("PutMany with a stale ETag succeeded")
	}
	if it, _ := s.Get(ctx, key+"a"); string(it.Value) != "a2" {
		t.Fatalf("a stale write in a batch was applied: %q", it.Value)
	}

	// Through Batching, concurrent writers each get their own answer: the
	// creates of fresh keys succeed, the create of an existing key fails.
	b := state.NewBatching(s, 0)
	errs := make([]error, 40)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := fmt.Sprint(key, "n", i)
			if i%10 == 9 {
				k = key + "a"
			}
			errs[i] = b.Put(ctx, k, []byte(fmt.Sprint("v", i)), state.PutOptions{IfAbsent: i%10 == 9})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		want := error(nil)
		if i%10 == 9 {
			want = state.ErrConflict
		}
		if !errors.Is(err, want) && !(want == nil && err == nil) {
			t.Fatalf("batched put %d: %v, want %v", i, err, want)
		}
		if i%10 != 9 {
			if it, err := b.Get(ctx, fmt.Sprint(key, "n", i)); err != nil || string(it.Value) != fmt.Sprint("v", i) {
				t.Fatalf("n%d = %q, %v", i, it.Value, err)
			}
		}
	}
}

// runVersionConformance checks a store whose ETags are versions
// (state.Versioned): after each write its ETag is NextETag of the one the
// write was conditioned on, so a write with that guess succeeds without a
// read, and fails once somebody else wrote the key.
func runVersionConformance(t *testing.T, s state.Store) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, ok := s.(state.Versioned)
	if !ok {
		t.Fatalf("%T is not state.Versioned", s)
	}
	key := state.KeyPrefix + "test/" + t.Name() + "/versions"
	guess, ok := v.NextETag("")
	if !ok {
		t.Fatal("the store does not report version ETags")
	}
	if err := s.Put(ctx, key, []byte("v1"), state.PutOptions{IfAbsent: true}); err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= 4; i++ {
		if it, err := s.Get(ctx, key); err != nil || it.ETag != guess {
			t.Fatalf("ETag %q after a write (%v), want the guess %q", it.ETag, err, guess)
		}
		next, _ := v.NextETag(guess)
		if err := s.Put(ctx, key, []byte(fmt.Sprint("v", i)), state.PutOptions{ETag: guess}); err != nil {
			t.Fatalf("write with the guessed ETag %q: %v", guess, err)
		}
		guess = next
	}
	if err := s.Put(ctx, key, []byte("other"), state.PutOptions{ETag: guess}); err != nil { // somebody else
		t.Fatal(err)
	}
	if err := s.Put(ctx, key, []byte("mine"), state.PutOptions{ETag: guess}); !errors.Is(err, state.ErrConflict) {
		t.Fatalf("write with a guess another write outdated: %v, want ErrConflict", err)
	}
}

func TestMemoryStore(t *testing.T) {
	runConformance(t, state.NewMemoryStore())
	runBulkConformance(t, state.NewMemoryStore())
	if _, ok := state.NewMemoryStore().NextETag(""); ok {
		t.Fatal("a MemoryStore without Versions reports version ETags")
	}
	versions := state.NewMemoryStore()
	versions.Versions = true
	runConformance(t, versions)
	runVersionConformance(t, versions)
}

// TestDaprStore runs the same contract on real daprd with state.redis.
func TestDaprStore(t *testing.T) {
	_, conn := devstack.StartT(t, devstack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := state.NewDaprStore(dapr.NewClientWithConnection(conn), devstack.StateName)
	if _, ok := s.NextETag(""); ok {
		t.Fatal("version ETags reported before DetectVersionETags")
	}
	if v, err := s.DetectVersionETags(ctx); err != nil || !v {
		t.Fatalf("DetectVersionETags on state.redis: %v %v, want true", v, err)
	}
	runConformance(t, s)
	runBulkConformance(t, s)
	runVersionConformance(t, s)

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

func TestFaultFile(t *testing.T) {
	path := t.TempDir() + "/faults"
	s := state.WithFaultFile(state.NewMemoryStore(), path)
	ctx := context.Background()
	if err := s.Put(ctx, "workmanager/workers/a/history", []byte("x"), state.PutOptions{}); err != nil {
		t.Fatalf("no fault file: %v", err)
	}
	if err := os.WriteFile(path, []byte("workmanager/workers/a/history\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "workmanager/workers/a/history", []byte("y"), state.PutOptions{}); err == nil || !strings.Contains(err.Error(), "injected fault") {
		t.Fatalf("listed key: %v", err)
	}
	if err := s.Put(ctx, "workmanager/workers/a", []byte("y"), state.PutOptions{}); err != nil {
		t.Fatalf("unlisted key: %v", err)
	}
	if it, _ := s.Get(ctx, "workmanager/workers/a/history"); string(it.Value) != "x" {
		t.Fatalf("the failed put was applied: %q", it.Value)
	}
}
