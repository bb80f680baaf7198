package publish_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"go.opentelemetry.io/otel/trace"

	"github.com/virtufin/workmanager/internal/publish"
)

// bulkFake is a broker that takes single publishes and bulk requests: it
// records every request, can hold them (gate), and refuses an event whose
// id starts with "bad" — a bulk request holding one adds the entries
// before it and then fails whole, as the Redis script does.
type bulkFake struct {
	mu      sync.Mutex
	added   []string            // "topic/id", in the order they were added
	singles int                 // Publish calls
	bulks   [][]string          // each PublishBatch's "topic/id"s
	fenced  int                 // PublishFenced calls
	gate    chan struct{}       // while not nil, every request waits for it to close
	entered chan struct{}       // a request reached the broker (buffered)
	byTopic map[string][]string // ids added per topic, in order
}

func newBulkFake() *bulkFake {
	return &bulkFake{entered: make(chan struct{}, 1024), byTopic: map[string][]string{}}
}

func (f *bulkFake) wait() {
	f.entered <- struct{}{}
	f.mu.Lock()
	g := f.gate
	f.mu.Unlock()
	if g != nil {
		<-g
	}
}

func (f *bulkFake) add(topic string, e *event.Event) error {
	if strings.HasPrefix(e.ID(), "bad") {
		return fmt.Errorf("refused %s", e.ID())
	}
	f.added = append(f.added, topic+"/"+e.ID())
	f.byTopic[topic] = append(f.byTopic[topic], e.ID())
	return nil
}

func (f *bulkFake) Publish(_ context.Context, topic string, e *event.Event) error {
	f.wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.singles++
	return f.add(topic, e)
}

func (f *bulkFake) PublishBatch(_ context.Context, topic string, es []*event.Event) error {
	f.wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for _, e := range es {
		ids = append(ids, topic+"/"+e.ID())
	}
	f.bulks = append(f.bulks, ids)
	for _, e := range es {
		if err := f.add(topic, e); err != nil {
			return err
		}
	}
	return nil
}

func (f *bulkFake) PublishFenced(ctx context.Context, topic, lock string, es []*event.Event) error {
	f.mu.Lock()
	f.fenced++
	f.mu.Unlock()
	return f.PublishBatch(ctx, topic, es)
}

func (f *bulkFake) hold() func() {
	g := make(chan struct{})
	f.mu.Lock()
	f.gate = g
	f.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			f.gate = nil
			f.mu.Unlock()
			close(g)
		})
	}
}

func ev(id string, size int) *event.Event {
	e := event.New()
	e.SetID(id)
	e.SetType("t")
	e.SetSource("s")
	e.DataEncoded = make([]byte, size)
	return &e
}

// waitFor polls cond until it holds (or fails the test after 10 s).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A caller alone publishes as a single Publish; callers that come while
// a request is in flight go out together, one bulk request per topic,
// each event once, each caller's events in its order.
func TestCoalescingBatchesConcurrentPublishes(t *testing.T) {
	f := newBulkFake()
	c := publish.NewCoalescing(f, 0)
	ctx := context.Background()
	if err := c.Publish(ctx, "a", ev("lone", 10)); err != nil {
		t.Fatal(err)
	}
	<-f.entered
	if f.singles != 1 || len(f.bulks) != 0 {
		t.Fatalf("a lone publish: %d singles, %d bulks; want it alone", f.singles, len(f.bulks))
	}

	release := f.hold()
	first := make(chan error, 1)
	go func() { first <- c.Publish(ctx, "a", ev("first", 10)) }()
	<-f.entered // the first request is in flight, held
	const callers, each = 8, 5
	var wg sync.WaitGroup
	errs := make(chan error, callers*each)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			topic := []string{"a", "b"}[i%2]
			for k := range each { // one after another, as the dispatcher publishes a call's outputs
				errs <- c.Publish(ctx, topic, ev(fmt.Sprintf("c%d-%d", i, k), 10))
			}
		}()
	}
	// Every caller's first event queues behind the held request.
	waitFor(t, "the callers to queue", func() bool { return c.Queued() == callers })
	release()
	wg.Wait()
	close(errs)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := map[string]int{}
	for _, a := range f.added {
		seen[a]++
	}
	if len(seen) != 2+callers*each || len(f.added) != len(seen) {
		t.Fatalf("%d events added, %d distinct; want %d, each once", len(f.added), len(seen), 2+callers*each)
	}
	if len(f.bulks) == 0 {
		t.Fatalf("no bulk request: %d singles", f.singles)
	}
	for _, b := range f.bulks {
		topic := strings.SplitN(b[0], "/", 2)[0]
		for _, x := range b {
			if !strings.HasPrefix(x, topic+"/") {
				t.Fatalf("a bulk request mixes topics: %v", b)
			}
		}
	}
	for i := range callers {
		topic := []string{"a", "b"}[i%2]
		next := 0
		for _, id := range f.byTopic[topic] {
			if strings.HasPrefix(id, fmt.Sprintf("c%d-", i)) {
				if id != fmt.Sprintf("c%d-%d", i, next) {
					t.Fatalf("caller %d's events out of order on %s: %v", i, topic, f.byTopic[topic])
				}
				next++
			}
		}
	}
	t.Logf("%d events: %d singles, %d bulk requests", len(f.added), f.singles, len(f.bulks))
}

// A bulk request that fails is retried event by event: the refused event
// fails its own call only, every other call succeeds, and its event is
// published (at least once).
func TestCoalescingFailedBatchFailsOnlyTheRefusedEvent(t *testing.T) {
	f := newBulkFake()
	c := publish.NewCoalescing(f, 0)
	ctx := context.Background()
	release := f.hold()
	first := make(chan error, 1)
	go func() { first <- c.Publish(ctx, "a", ev("first", 10)) }()
	<-f.entered
	ids := []string{"ok1", "ok2", "bad3", "ok4", "ok5"}
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.Publish(ctx, "a", ev(id, 10))
		}()
	}
	waitFor(t, "the callers to queue", func() bool { return c.Queued() == len(ids) })
	release()
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		if bad := strings.HasPrefix(id, "bad"); bad != (errs[i] != nil) {
			t.Fatalf("%s: error %v", id, errs[i])
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.bulks) == 0 {
		t.Fatal("the queued publishes did not go as a bulk request")
	}
	for _, id := range ids {
		n := 0
		for _, a := range f.added {
			if a == "a/"+id {
				n++
			}
		}
		if bad := strings.HasPrefix(id, "bad"); (n == 0) != bad {
			t.Fatalf("%s added %d times", id, n)
		}
	}
}

// No request carries more than CoalesceMaxBytes of data; an event larger
// than that goes alone, without waiting for the batch in flight.
func TestCoalescingBoundsARequestsBytes(t *testing.T) {
	f := newBulkFake()
	c := publish.NewCoalescing(f, 0)
	ctx := context.Background()
	release := f.hold()
	first := make(chan error, 1)
	go func() { first <- c.Publish(ctx, "a", ev("first", 10)) }()
	<-f.entered
	third := publish.CoalesceMaxBytes * 2 / 5
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Publish(ctx, "a", ev(fmt.Sprintf("big%d", i), third)); err != nil {
				t.Error(err)
			}
		}()
	}
	waitFor(t, "the callers to queue", func() bool { return c.Queued() == 5 })
	// Larger than a request may be: straight to the broker (which holds it
	// like every request now), not queued behind the batch in flight.
	huge := make(chan error, 1)
	go func() { huge <- c.Publish(ctx, "a", ev("huge", publish.CoalesceMaxBytes+1)) }()
	<-f.entered
	if q := c.Queued(); q != 5 {
		t.Fatalf("%d queued, want the 5 big ones only", q)
	}
	release()
	wg.Wait()
	if err := <-huge; err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.bulks {
		if len(b)*third > publish.CoalesceMaxBytes {
			t.Fatalf("a bulk request of %d events of %d bytes", len(b), third)
		}
	}
	if len(f.added) != 7 {
		t.Fatalf("%d added, want 7", len(f.added))
	}
}

// A caller whose context ends stops waiting; a traced call publishes on
// its own (daprd continues its trace); fenced requests go straight through.
func TestCoalescingCallersKeepTheirOwnContext(t *testing.T) {
	f := newBulkFake()
	c := publish.NewCoalescing(f, 0)
	release := f.hold()
	defer release()
	first := make(chan error, 1)
	go func() { first <- c.Publish(context.Background(), "a", ev("first", 10)) }()
	<-f.entered

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := c.Publish(ctx, "a", ev("late", 10)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a caller whose context ended: %v, want its deadline", err)
	}

	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled})
	traced := make(chan error, 1)
	go func() {
		traced <- c.Publish(trace.ContextWithSpanContext(context.Background(), sc), "a", ev("traced", 10))
	}()
	<-f.entered // reached the broker beside the held request, not queued
	fenced := make(chan error, 1)
	go func() {
		fenced <- c.PublishFenced(context.Background(), "a", "lock", []*event.Event{ev("f1", 10), ev("f2", 10)})
	}()
	<-f.entered
	release()
	for _, ch := range []chan error{first, traced, fenced} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	if f.fenced != 1 {
		t.Fatalf("%d fenced requests, want 1", f.fenced)
	}
}
