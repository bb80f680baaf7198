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

// fencedFake is bulkFake with runs of several locks in one request
// (publish.RunsFencer): each lock's mark is the highest token it took; a
// run whose first token is below it is refused, the others added. While
// failRuns is set a request of runs fails whole (after adding nothing).
type fencedFake struct {
	*bulkFake
	marks    map[string]int
	runReqs  [][]string // each request's locks
	failRuns bool
}

func token(e *event.Event) int {
	var n int
	fmt.Sscan(e.Extensions()[publish.FencingExtension].(string), &n)
	return n
}

func (f *fencedFake) fence(lock string, es []*event.Event) error {
	if token(es[0]) < f.marks[lock] {
		return fmt.Errorf("%w: %s", publish.ErrFenced, lock)
	}
	for _, e := range es {
		f.add("out", e)
	}
	f.marks[lock] = token(es[len(es)-1])
	return nil
}

func (f *fencedFake) PublishFenced(_ context.Context, topic, lock string, es []*event.Event) error {
	f.wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fenced++
	return f.fence(lock, es)
}

func (f *fencedFake) PublishFencedRuns(_ context.Context, topic string, runs []publish.FencedRun) ([]error, error) {
	f.wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	var locks []string
	for _, r := range runs {
		locks = append(locks, r.Lock)
	}
	f.runReqs = append(f.runReqs, locks)
	if f.failRuns {
		return nil, errors.New("daprd unreachable")
	}
	errs := make([]error, len(runs))
	for i, r := range runs {
		errs[i] = f.fence(r.Lock, r.Events)
	}
	return errs, nil
}

func fencedEv(id string, tok int) *event.Event {
	e := ev(id, 10)
	e.SetExtension(publish.FencingExtension, fmt.Sprint(tok))
	return e
}

// Fenced publishes of many locks to one topic, made while one is in
// flight, go out as one request of runs; a stale run is refused on its
// own (ErrFenced to its caller only); a request that fails whole is
// retried run by run.
func TestCoalescingFencedRunsOfManyLocks(t *testing.T) {
	f := &fencedFake{bulkFake: newBulkFake(), marks: map[string]int{"stale": 9}}
	c := publish.NewCoalescing(f, 0)
	ctx := context.Background()
	round := func(first string) map[string]error {
		release, firstErr := inFlight(t, f.bulkFake, func() error {
			return c.PublishFenced(ctx, "out", first, []*event.Event{fencedEv(first+"-0", 1)})
		})
		locks := []string{"k1", "k2", "stale", "k3", "k4"}
		errs := map[string]error{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, l := range locks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tok := 1
				if l == "stale" {
					tok = 5
				}
				err := c.PublishFenced(ctx, "out", l, []*event.Event{fencedEv(first+l+"-a", tok), fencedEv(first+l+"-b", tok)})
				mu.Lock()
				errs[l] = err
				mu.Unlock()
			}()
		}
		waitFor(t, "the fenced callers to queue", func() bool { return c.Queued() == len(locks) })
		release()
		wg.Wait()
		if err := <-firstErr; err != nil {
			t.Fatal(err)
		}
		return errs
	}
	check := func(errs map[string]error) {
		t.Helper()
		for l, err := range errs {
			if stale := l == "stale"; stale != errors.Is(err, publish.ErrFenced) || !stale && err != nil {
				t.Fatalf("lock %s: %v", l, err)
			}
		}
	}
	check(round("r1"))
	f.mu.Lock()
	if len(f.runReqs) != 1 || len(f.runReqs[0]) != 5 {
		t.Fatalf("requests of runs %v, want one of the 5 queued locks", f.runReqs)
	}
	for _, id := range []string{"r1k1-a", "r1k1-b", "r1k4-b"} {
		if f.byTopic["out"] == nil || !contains(f.byTopic["out"], id) {
			t.Fatalf("%s not published: %v", id, f.byTopic["out"])
		}
	}
	if contains(f.byTopic["out"], "r1stale-a") {
		t.Fatal("the stale run was published")
	}
	f.failRuns = true
	f.mu.Unlock()

	// A request that fails whole: each run again alone, as its caller's
	// own fenced publish; the marks refuse the runs already taken... here
	// none was, so each is published once, the stale one still refused.
	before := f.fenced
	f.marks["k1"], f.marks["k2"], f.marks["k3"], f.marks["k4"] = 0, 0, 0, 0
	check(round("r2"))
	f.mu.Lock()
	defer f.mu.Unlock()
	if alone := f.fenced - before; alone != 1+5 {
		t.Fatalf("%d fenced publishes alone, want the first and the 5 retried", alone)
	}
	for _, id := range []string{"r2k1-a", "r2k2-b", "r2k4-a"} {
		if !contains(f.byTopic["out"], id) {
			t.Fatalf("%s not published after the retry: %v", id, f.byTopic["out"])
		}
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// inFlight holds the broker, sends one request (send) and returns once it
// reached the broker: what callers publish meanwhile queues behind it
// until release.
func inFlight(t *testing.T, f *bulkFake, send func() error) (release func(), first <-chan error) {
	t.Helper()
	release = f.hold()
	ch := make(chan error, 1)
	go func() { ch <- send() }()
	f.reached(t)
	return release, ch
}

// reached waits for the next request to reach the broker (10 s at most).
func (f *bulkFake) reached(t *testing.T) {
	t.Helper()
	select {
	case <-f.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for a request to reach the broker")
	}
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
	f.reached(t)
	if f.singles != 1 || len(f.bulks) != 0 {
		t.Fatalf("a lone publish: %d singles, %d bulks; want it alone", f.singles, len(f.bulks))
	}

	// The first request is in flight, held: the callers queue behind it.
	release, first := inFlight(t, f, func() error { return c.Publish(ctx, "a", ev("first", 10)) })
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
	release, first := inFlight(t, f, func() error { return c.Publish(ctx, "a", ev("first", 10)) })
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
	release, first := inFlight(t, f, func() error { return c.Publish(ctx, "a", ev("first", 10)) })
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
	f.reached(t)
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
	release, first := inFlight(t, f, func() error { return c.Publish(context.Background(), "a", ev("first", 10)) })
	defer release()

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
	f.reached(t) // beside the held request, not queued
	fenced := make(chan error, 1)
	go func() {
		fenced <- c.PublishFenced(context.Background(), "a", "lock", []*event.Event{ev("f1", 10), ev("f2", 10)})
	}()
	f.reached(t)
	release()
	for _, ch := range []<-chan error{first, traced, fenced} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	if f.fenced != 1 {
		t.Fatalf("%d fenced requests, want 1", f.fenced)
	}
}
