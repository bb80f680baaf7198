package redisstreams

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dapr/components-contrib/metadata"
	"github.com/dapr/components-contrib/pubsub"
	rterrors "github.com/dapr/dapr/pkg/runtime/errors"
	"github.com/dapr/kit/logger"

	"github.com/virtufin/workmanager/deploy/dapr/daprd/internal/redistest"
)

// A failed message far down the pending list is redelivered even while
// more than queueDepth older entries are in flight: upstream read only the
// first queueDepth entries of the list, so it starved (chaos finding 2).
func TestReclaimWalksThePendingListPastItsFirstPage(t *testing.T) {
	addr := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	r := NewRedisStreams(logger.NewLogger("test")).(*redisStreams)
	const depth = 10
	err := r.Init(ctx, pubsub.Metadata{Base: metadata.Base{Properties: map[string]string{
		"redisHost": addr, "queueDepth": strconv.Itoa(depth), "concurrency": "4",
		"processingTimeout": "10s", "redeliverInterval": "1s",
	}}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	const stream, total, stale = "orders", 3*depth + 5, 5
	if err := r.client.XGroupCreateMkStream(ctx, stream, r.clientSettings.ConsumerID, "0"); err != nil {
		t.Fatal(err)
	}
	for i := range total {
		if _, err := r.client.XAdd(ctx, stream, 0, map[string]any{"data": fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	// Every entry delivered once (pending, idle 0: "in flight")...
	got, err := r.client.XReadGroupResult(ctx, r.clientSettings.ConsumerID, r.clientSettings.ConsumerID, []string{stream, ">"}, total, 0)
	if err != nil || len(got) != 1 || len(got[0].Messages) != total {
		t.Fatalf("XREADGROUP: %v %v", got, err)
	}
	// ...and the last few failed long ago (idle past the processing timeout).
	want := map[string]bool{}
	for _, m := range got[0].Messages[total-stale:] {
		if err := r.client.DoWrite(ctx, "XCLAIM", stream, r.clientSettings.ConsumerID, r.clientSettings.ConsumerID, 0, m.ID, "IDLE", 60000); err != nil {
			t.Fatal(err)
		}
		want[m.ID] = true
	}

	var mu sync.Mutex
	seen := map[string]bool{}
	r.reclaimPendingMessages(ctx, stream, func(ctx context.Context, msg *pubsub.NewMessage) error {
		mu.Lock()
		defer mu.Unlock()
		seen[string(msg.Data)] = true
		return nil
	})
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n == stale {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("redelivered %d of the %d failed messages behind %d in-flight ones (%v)", n, stale, total-stale, seen)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i := total - stale; i < total; i++ {
		if !seen[fmt.Sprint(i)] {
			t.Errorf("message %d not redelivered; got %v", i, seen)
		}
	}
	// In-flight entries are left alone.
	if len(seen) != stale {
		t.Errorf("redelivered %d messages, want only the %d failed ones: %v", len(seen), stale, seen)
	}
}

// The redelivery scans of the daprds of one consumer group are spaced at
// random, so which of them redelivers a message is random too.
func TestRedeliveryScansAreJittered(t *testing.T) {
	const d = time.Second
	seen := map[time.Duration]bool{}
	for range 1000 {
		j := jittered(d)
		if j < d/2 || j > 3*d/2 {
			t.Fatalf("jittered(%s) = %s, outside [%s, %s]", d, j, d/2, 3*d/2)
		}
		seen[j.Round(100*time.Millisecond)] = true
	}
	if len(seen) < 8 {
		t.Fatalf("jittered(%s) took only %d distinct values (rounded to 100ms) in 1000 draws", d, len(seen))
	}
}

// A daprd whose app stops answering (paused) stops taking the stream's
// messages (change 8): the messages it read time out once and go to the
// daprd whose app answers, and it reads and claims nothing while stalled.
// Upstream kept reading and claiming, so every redelivery was a coin toss
// between the two apps.
func TestAStuckAppLeavesItsMessagesToTheOthers(t *testing.T) {
	addr := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	newComponent := func() *redisStreams {
		r := NewRedisStreams(logger.NewLogger("test")).(*redisStreams)
		if err := r.Init(ctx, pubsub.Metadata{Base: metadata.Base{Properties: map[string]string{
			"redisHost": addr, "queueDepth": "1", "concurrency": "1",
			"processingTimeout": "3s", "redeliverInterval": "200ms",
			"consumerID": "workmanager", // one app id: one consumer group, as on the nodes
		}}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	const stream, total = "orders", 20
	var (
		mu         sync.Mutex
		stuckCalls int
		live       = map[string]bool{}
	)
	stuck := newComponent()
	var stalledCalls int
	if err := stuck.Subscribe(ctx, pubsub.SubscribeRequest{Topic: stream}, func(ctx context.Context, msg *pubsub.NewMessage) error {
		mu.Lock()
		stuckCalls++
		if stuck.appStalled() {
			stalledCalls++
		}
		mu.Unlock()
		<-ctx.Done() // a hung app: no answer until daprd gives up
		return ctx.Err()
	}); err != nil {
		t.Fatal(err)
	}
	publish := func(i int) {
		if err := stuck.Publish(ctx, &pubsub.PublishRequest{Topic: stream, Data: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			mu.Lock()
			done := ok()
			mu.Unlock()
			if done {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: stuck app called %d times, live app got %d of %d", what, stuckCalls, len(live), total)
			}
		}
	}
	publish(0)
	waitUntil("the stuck app gets the first message", func() bool { return stuckCalls == 1 })
	// Its answer times out (processingTimeout): it stalls.
	waitUntil("the stuck app's daprd stalls", func() bool { return stuck.appStalled() })
	answering := newComponent()
	if err := answering.Subscribe(ctx, pubsub.SubscribeRequest{Topic: stream}, func(ctx context.Context, msg *pubsub.NewMessage) error {
		mu.Lock()
		live[string(msg.Data)] = true
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < total; i++ {
		publish(i)
	}
	// Every message reaches the live app, the stuck one's first message
	// included (claimed by the live daprd), however long a loaded machine
	// takes; and no message was handed to the stuck app while it stalled
	// (counted in its handler, which a stalled daprd must not call).
	waitUntil("every message answered by the live app", func() bool { return len(live) == total })
	mu.Lock()
	defer mu.Unlock()
	if stalledCalls != 0 {
		t.Fatalf("the stuck app was handed %d messages while its daprd stalled", stalledCalls)
	}
}

// redeliverInterval is honoured as a duration, as the manifests write it
// (change 9); upstream kept its 15s default for anything but a number.
func TestRedeliverIntervalTakesADuration(t *testing.T) {
	for v, want := range map[string]time.Duration{"": 15 * time.Second, "2s": 2 * time.Second, "1500": 1500 * time.Millisecond, "250ms": 250 * time.Millisecond} {
		got, err := parseRedeliverInterval(map[string]string{"redeliverInterval": v}, 15*time.Second)
		if err != nil || got != want {
			t.Errorf("redeliverInterval %q: %s, %v; want %s", v, got, err, want)
		}
	}
	if _, err := parseRedeliverInterval(map[string]string{"redeliverInterval": "soon"}, 0); err == nil || !strings.Contains(err.Error(), `"soon"`) {
		t.Errorf("redeliverInterval \"soon\": %v; want an error naming it", err)
	}
}

// A message published right after a subscription ends — taken by the
// read still in flight for the closed subscription — reaches the topic's
// next subscription at the next redelivery scan, not after the whole
// processingTimeout (change 10). A worker stopped and started again at
// once lost its first message for 45 s under deploy/'s setting.
func TestAMessageReadForAClosedSubscriptionIsGivenBack(t *testing.T) {
	ctx, r := newStreamsWith(t, map[string]string{"processingTimeout": "30s", "redeliverInterval": "10s", "consumerID": "workmanager"})
	const stream = "orders"
	got := make(chan string, 16)
	handler := func(_ context.Context, msg *pubsub.NewMessage) error {
		got <- string(msg.Data)
		return nil
	}
	publish := func(s string) {
		if err := r.Publish(ctx, &pubsub.PublishRequest{Topic: stream, Data: []byte(s)}); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(want string, within time.Duration) {
		t.Helper()
		select {
		case m := <-got:
			if m != want {
				t.Fatalf("got %q, want %q", m, want)
			}
		case <-time.After(within):
			t.Fatalf("%q not delivered within %s (processingTimeout is 30s)", want, within)
		}
	}
	for round := range 3 {
		subCtx, unsubscribe := context.WithCancel(ctx)
		if err := r.Subscribe(subCtx, pubsub.SubscribeRequest{Topic: stream}, handler); err != nil {
			t.Fatal(err)
		}
		first := fmt.Sprintf("before-%d", round)
		publish(first)
		expect(first, 10*time.Second)
		// The subscription ends (a worker stopped) and the next message
		// comes at once, while the ended subscription's read is still
		// blocked; then the topic is subscribed again (started again).
		unsubscribe()
		after := fmt.Sprintf("after-%d", round)
		publish(after)
		next, stop := context.WithCancel(ctx)
		if err := r.Subscribe(next, pubsub.SubscribeRequest{Topic: stream}, handler); err != nil {
			t.Fatal(err)
		}
		// The next subscription here scans at once when the message is
		// given back, not at its next redelivery scan (10s).
		expect(after, 5*time.Second)
		stop()
	}
}

// Change 11: BulkPublish adds every entry in the request's order (the
// nodes rely on it for a group's outputs, published in fencing-token
// order in one request), with its metadata, capped like Publish; daprd
// uses it only because Features says so.
func TestBulkPublishKeepsTheOrder(t *testing.T) {
	ctx, r := newStreams(t)
	if !pubsub.FeatureBulkPublish.IsPresent(r.Features()) {
		t.Fatal("FeatureBulkPublish not advertised: daprd would fall back to its unordered publisher")
	}
	const n = 200
	req := &pubsub.BulkPublishRequest{Topic: "ordered"}
	for i := range n {
		e := pubsub.BulkMessageEntry{EntryId: strconv.Itoa(i), Event: []byte(`{"n":` + strconv.Itoa(i) + `}`), ContentType: "application/json"}
		if i%2 == 0 {
			e.Metadata = map[string]string{"k": strconv.Itoa(i)}
		}
		req.Entries = append(req.Entries, e)
	}
	if res, err := r.BulkPublish(ctx, req); err != nil || len(res.FailedEntries) != 0 {
		t.Fatalf("BulkPublish: %v, %d failed", err, len(res.FailedEntries))
	}
	entries := xrange(ctx, t, r, "ordered")
	if got := len(entries); got != n {
		t.Fatalf("%d entries in the stream, want %d", got, n)
	}
	for i, m := range entries {
		if want := `{"n":` + strconv.Itoa(i) + `}`; m["data"] != want {
			t.Fatalf("entry %d is %v, want %s: out of order", i, m["data"], want)
		}
		meta, has := m["metadata"]
		if i%2 == 0 != has || has && meta != `{"k":"`+strconv.Itoa(i)+`"}` {
			t.Fatalf("entry %d metadata %v (present %v)", i, meta, has)
		}
	}

	// A cap per request, as Publish takes it; a bad one fails every entry.
	capped := &pubsub.BulkPublishRequest{Topic: "capped"}
	for i := range 1000 {
		capped.Entries = append(capped.Entries, pubsub.BulkMessageEntry{EntryId: strconv.Itoa(i), Event: []byte("x"), Metadata: map[string]string{maxLenApprox: "10"}})
	}
	if _, err := r.BulkPublish(ctx, capped); err != nil {
		t.Fatal(err)
	}
	if l := len(xrange(ctx, t, r, "capped")); l >= 1000 {
		t.Fatalf("capped stream holds %d entries: the cap was not applied", l)
	}
	capped.Entries[0].Metadata = map[string]string{maxLenApprox: "-1"}
	if res, err := r.BulkPublish(ctx, capped); err == nil || len(res.FailedEntries) != 1000 {
		t.Fatalf("a bad cap: %v, %d failed entries", err, len(res.FailedEntries))
	}
}

// xrange reads every entry of stream as its fields, in stream order.
func xrange(ctx context.Context, t *testing.T, r *redisStreams, stream string) []map[string]string {
	t.Helper()
	raw, err := r.client.DoRead(ctx, "XRANGE", stream, "-", "+")
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]string
	for _, e := range raw.([]any) {
		fields := e.([]any)[1].([]any)
		m := map[string]string{}
		for i := 0; i+1 < len(fields); i += 2 {
			m[fmt.Sprint(fields[i])] = fmt.Sprint(fields[i+1])
		}
		out = append(out, m)
	}
	return out
}

// TestFencedPublishRefusesAStaleToken is change 12: outputs fenced by a
// lock are refused, whole request, when the stream already took a higher
// token of that lock (a holder paused between its lock check and its
// publish); equal tokens, other locks and other streams pass; the fence
// fields are not stored.
func TestFencedPublishRefusesAStaleToken(t *testing.T) {
	ctx, r := newStreams(t)
	bulk := func(topic, lock string, tokens ...int64) error {
		req := &pubsub.BulkPublishRequest{Topic: topic}
		for i, tok := range tokens {
			req.Entries = append(req.Entries, pubsub.BulkMessageEntry{EntryId: strconv.Itoa(i), Event: []byte(strconv.FormatInt(tok, 10)),
				Metadata: map[string]string{fenceLock: lock, fenceToken: strconv.FormatInt(tok, 10), maxLenApprox: "100000"}})
		}
		res, err := r.BulkPublish(ctx, req)
		if err != nil && len(res.FailedEntries) != len(tokens) {
			t.Fatalf("a failed request reports %d of %d entries failed", len(res.FailedEntries), len(tokens))
		}
		return err
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(bulk("out", "t/g", 9, 10, 10))
	must(bulk("out", "t/g", 10, 12)) // the same token again: the same call
	err := bulk("out", "t/g", 11, 13)
	if err == nil || !strings.Contains(err.Error(), fencedReply) {
		t.Fatalf("token 11 after 12: %v, want a %s refusal", err, fencedReply)
	}
	must(bulk("other", "t/g", 3))   // another stream has its own mark
	must(bulk("out", "t/g2", 1))    // and another lock
	must(bulk("out", "t/g", 1<<60)) // beyond a double's precision
	if err := bulk("out", "t/g", 1<<60-1); err == nil {
		t.Fatal("token 2^60-1 after 2^60 was taken")
	}
	// A single Publish with a fence goes through the same check.
	one := func(tok string) error {
		return r.Publish(ctx, &pubsub.PublishRequest{Topic: "out", Data: []byte(tok), Metadata: map[string]string{fenceLock: "t/g", fenceToken: tok}})
	}
	if err := one("5"); err == nil || !strings.Contains(err.Error(), fencedReply) {
		t.Fatalf("a single stale publish: %v", err)
	}
	must(one(strconv.FormatInt(1<<60+1, 10)))

	var got []string
	for _, m := range xrange(ctx, t, r, "out") {
		got = append(got, m["data"])
		if strings.Contains(m["metadata"], fenceLock) {
			t.Fatalf("fence stored with the entry: %s", m["metadata"])
		}
	}
	want := []string{"9", "10", "10", "10", "12", "1", strconv.FormatInt(1<<60, 10), strconv.FormatInt(1<<60+1, 10)}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("stream holds %v, want %v", got, want)
	}

	// Bad fences are refused with what is wrong.
	for name, req := range map[string]*pubsub.BulkPublishRequest{
		"mixed":        {Topic: "out", Entries: []pubsub.BulkMessageEntry{{EntryId: "0", Event: []byte("x"), Metadata: map[string]string{fenceLock: "t/g", fenceToken: "20"}}, {EntryId: "1", Event: []byte("y")}}},
		"mixed later":  {Topic: "out", Entries: []pubsub.BulkMessageEntry{{EntryId: "0", Event: []byte("x"), Metadata: map[string]string{fenceLock: "t/g", fenceToken: "20"}}, {EntryId: "1", Event: []byte("y"), Metadata: map[string]string{fenceLock: "t/h", fenceToken: "20"}}, {EntryId: "2", Event: []byte("z")}}},
		"empty lock":   {Topic: "out", Entries: []pubsub.BulkMessageEntry{{EntryId: "0", Event: []byte("x"), Metadata: map[string]string{fenceLock: "", fenceToken: "20"}}}},
		"backwards":    {Topic: "out", Entries: []pubsub.BulkMessageEntry{{EntryId: "0", Event: []byte("x"), Metadata: map[string]string{fenceLock: "t/g", fenceToken: "21"}}, {EntryId: "1", Event: []byte("y"), Metadata: map[string]string{fenceLock: "t/g", fenceToken: "20"}}}},
		"not a number": {Topic: "out", Entries: []pubsub.BulkMessageEntry{{EntryId: "0", Event: []byte("x"), Metadata: map[string]string{fenceLock: "t/g", fenceToken: "0x10"}}}},
	} {
		if _, err := r.BulkPublish(ctx, req); err == nil {
			t.Errorf("%s: taken", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	if n := len(xrange(ctx, t, r, "out")); n != len(want) {
		t.Fatalf("%d entries after the bad requests, want %d", n, len(want))
	}
}

// TestFencedRunsAreCheckedEachOnItsOwn is change 13: one request holds
// the outputs of several locks, each lock's entries consecutive; a run
// whose lock already took a higher token is refused (its entries come
// back failed, WMFENCED) while the other runs are added, in order, and
// move their own marks; the request itself does not fail.
func TestFencedRunsAreCheckedEachOnItsOwn(t *testing.T) {
	ctx, r := newStreams(t)
	type ent struct {
		lock string
		tok  int64
	}
	send := func(es ...ent) (failed []string) {
		t.Helper()
		req := &pubsub.BulkPublishRequest{Topic: "out"}
		for i, e := range es {
			req.Entries = append(req.Entries, pubsub.BulkMessageEntry{EntryId: strconv.Itoa(i),
				Event:    []byte(e.lock + ":" + strconv.FormatInt(e.tok, 10)),
				Metadata: map[string]string{fenceLock: e.lock, fenceToken: strconv.FormatInt(e.tok, 10), maxLenApprox: "100000"}})
		}
		res, err := r.BulkPublish(ctx, req)
		if err != nil {
			t.Fatalf("a request of runs failed whole: %v", err)
		}
		for _, f := range res.FailedEntries {
			if f.Error == nil || !strings.HasPrefix(f.Error.Error(), fencedReply) {
				t.Fatalf("entry %s failed with %v, want a %s refusal", f.EntryId, f.Error, fencedReply)
			}
			failed = append(failed, f.EntryId)
		}
		return failed
	}
	if f := send(ent{"g", 10}); len(f) != 0 {
		t.Fatalf("refused %v", f)
	}
	// g's run is stale (5 after 10); h's and k's are new.
	if f := send(ent{"h", 1}, ent{"h", 2}, ent{"g", 5}, ent{"g", 6}, ent{"k", 7}); strings.Join(f, ",") != "2,3" {
		t.Fatalf("refused entries %v, want 2,3 (lock g's run)", f)
	}
	// A lock may come back later in the request: each run is checked
	// against the mark as the runs before it left it.
	if f := send(ent{"g", 11}, ent{"h", 3}, ent{"g", 12}); len(f) != 0 {
		t.Fatalf("refused %v", f)
	}
	if f := send(ent{"g", 14}, ent{"h", 4}, ent{"g", 13}); strings.Join(f, ",") != "2" {
		t.Fatalf("refused entries %v, want 2 (g's 13 after its 14)", f)
	}
	// A stale holder's single fenced publish is still refused whole.
	err := r.Publish(ctx, &pubsub.PublishRequest{Topic: "out", Data: []byte("h:2"), Metadata: map[string]string{fenceLock: "h", fenceToken: "2"}})
	if err == nil || !strings.Contains(err.Error(), fencedReply) {
		t.Fatalf("h's token 2 after 4: %v", err)
	}
	var got []string
	for _, m := range xrange(ctx, t, r, "out") {
		got = append(got, m["data"])
		if strings.Contains(m["metadata"], fenceLock) {
			t.Fatalf("fence stored with the entry: %s", m["metadata"])
		}
	}
	if want := "g:10 h:1 h:2 k:7 g:11 h:3 g:12 g:14 h:4"; strings.Join(got, " ") != want {
		t.Fatalf("stream holds %v, want %s", got, want)
	}
	// Too many runs in one request: refused whole, nothing added.
	var many []ent
	for i := range maxFenceRuns + 1 {
		many = append(many, ent{"lock-" + strconv.Itoa(i), 1})
	}
	req := &pubsub.BulkPublishRequest{Topic: "out"}
	for i, e := range many {
		req.Entries = append(req.Entries, pubsub.BulkMessageEntry{EntryId: strconv.Itoa(i), Event: []byte("x"),
			Metadata: map[string]string{fenceLock: e.lock, fenceToken: "1"}})
	}
	if res, err := r.BulkPublish(ctx, req); err == nil || len(res.FailedEntries) != len(many) {
		t.Fatalf("%d runs: %v, %d failed entries", len(many), err, len(res.FailedEntries))
	}
	// maxFenceRuns runs, every other one stale: the mask reaches its top bit.
	req.Entries = req.Entries[:maxFenceRuns]
	for i := 0; i < maxFenceRuns; i += 2 {
		if err := r.Publish(ctx, &pubsub.PublishRequest{Topic: "out", Data: []byte("x"), Metadata: map[string]string{fenceLock: many[i].lock, fenceToken: "2"}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i < maxFenceRuns; i += 2 { // odd runs: a mark of 2 too, refused (1 < 2)
		if err := r.Publish(ctx, &pubsub.PublishRequest{Topic: "out", Data: []byte("x"), Metadata: map[string]string{fenceLock: many[i].lock, fenceToken: "2"}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < maxFenceRuns; i += 2 { // even runs: token 3, taken
		req.Entries[i].Metadata = map[string]string{fenceLock: many[i].lock, fenceToken: "3"}
	}
	res, err := r.BulkPublish(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.FailedEntries) != maxFenceRuns/2 || res.FailedEntries[len(res.FailedEntries)-1].EntryId != strconv.Itoa(maxFenceRuns-1) {
		t.Fatalf("%d failed entries (last %v), want the %d odd runs", len(res.FailedEntries), res.FailedEntries[len(res.FailedEntries)-1].EntryId, maxFenceRuns/2)
	}
}

// newStreams is the component on a Redis of the test's own, closed when
// the test ends, and a context bounded by a minute.
func newStreams(t *testing.T) (context.Context, *redisStreams) {
	return newStreamsWith(t, nil)
}

// newStreamsWith is newStreams with the component's metadata props.
func newStreamsWith(t *testing.T, props map[string]string) (context.Context, *redisStreams) {
	t.Helper()
	addr := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	all := map[string]string{"redisHost": addr}
	for k, v := range props {
		all[k] = v
	}
	r := NewRedisStreams(logger.NewLogger("test")).(*redisStreams)
	if err := r.Init(ctx, pubsub.Metadata{Base: metadata.Base{Properties: all}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return ctx, r
}

// retryAnswer is the error daprd hands the component when the app answers
// a message RETRY (streamer.Publish, daprd 1.14).
func retryAnswer(id string) error {
	return fmt.Errorf("RETRY status returned from app while processing pub/sub event %v: %w", id, rterrors.NewRetriable(nil))
}

// Change 14: a message the app answers RETRY for comes back after
// retryDelay, doubling with each delivery, not after processingTimeout
// (30s here); a delivery that failed without an answer (the stream to the
// app broken, the app perhaps still running it) waits processingTimeout.
func TestARetryComesBackAfterRetryDelay(t *testing.T) {
	ctx, r := newStreamsWith(t, map[string]string{"processingTimeout": "30s", "redeliverInterval": "10s", "retryDelay": "200ms", "consumerID": "workmanager"})
	const stream, answers = "orders", 4
	var (
		mu    sync.Mutex
		times = map[string][]time.Time{}
	)
	if err := r.Subscribe(ctx, pubsub.SubscribeRequest{Topic: stream}, func(_ context.Context, msg *pubsub.NewMessage) error {
		mu.Lock()
		defer mu.Unlock()
		m := string(msg.Data)
		times[m] = append(times[m], time.Now())
		switch {
		case m == "broken" && len(times[m]) == 1:
			return fmt.Errorf("error returned from app while processing pub/sub event %v: %w", m, rterrors.NewRetriable(errors.New("transport is closing")))
		case m == "retried" && len(times[m]) < answers:
			return retryAnswer(m)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"retried", "broken"} {
		if err := r.Publish(ctx, &pubsub.PublishRequest{Topic: stream, Data: []byte(m)}); err != nil {
			t.Fatal(err)
		}
	}
	deliveries := func(m string) []time.Time {
		mu.Lock()
		defer mu.Unlock()
		return append([]time.Time(nil), times[m]...)
	}
	for deadline := time.Now().Add(20 * time.Second); len(deliveries("retried")) < answers; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("answered RETRY: %d deliveries in 20s, want %d well before processingTimeout (30s)", len(deliveries("retried")), answers)
		}
	}
	got := deliveries("retried")
	for i := 1; i < len(got); i++ {
		// retryDelay doubled per delivery before, at least half of it (the jitter).
		if least := (200 * time.Millisecond << (i - 1)) / 2; got[i].Sub(got[i-1]) < least {
			t.Errorf("delivery %d came %s after the one before, want at least %s", i+1, got[i].Sub(got[i-1]), least)
		}
	}
	if n := len(deliveries("broken")); n != 1 {
		t.Errorf("a delivery that failed without an answer was delivered %d times before processingTimeout, want 1", n)
	}
	// The last answer acknowledged it: nothing of "retried" is pending.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		p, err := r.client.XPendingExtResult(ctx, stream, "workmanager", "-", "+", 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(p) == 1 { // "broken", waiting for processingTimeout
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pending: %+v, want only the failed delivery", p)
		}
	}
}

// Change 14: the idle time of a message answered RETRY is shortened only
// while it is still at the delivery this daprd handed out: one another
// daprd claimed since (it runs there now) is left alone, and the delay
// grows with the deliveries up to processingTimeout.
func TestRetrySoonLeavesAnotherDeliveryAlone(t *testing.T) {
	ctx, r := newStreams(t)
	r.clientSettings.ProcessingTimeout, r.clientSettings.RedeliverInterval, r.retryDelay = 30*time.Second, 10*time.Second, time.Second
	const stream = "orders"
	if err := r.client.XGroupCreateMkStream(ctx, stream, r.clientSettings.ConsumerID, "0"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.XAdd(ctx, stream, 0, map[string]any{"data": "m"}); err != nil {
		t.Fatal(err)
	}
	read, err := r.client.XReadGroupResult(ctx, r.clientSettings.ConsumerID, r.clientSettings.ConsumerID, []string{stream, ">"}, 1, time.Second)
	if err != nil || len(read) != 1 || len(read[0].Messages) != 1 {
		t.Fatalf("read: %v, %v", read, err)
	}
	id := read[0].Messages[0].ID
	idle := func() (time.Duration, int64) {
		t.Helper()
		p, err := r.client.XPendingExtResult(ctx, stream, r.clientSettings.ConsumerID, id, id, 1)
		if err != nil || len(p) != 1 {
			t.Fatalf("pending %s: %v, %v", id, p, err)
		}
		return p[0].Idle, p[0].RetryCount
	}
	// Another daprd claimed it since (its delivery count is now 2): the
	// answer to delivery 1 leaves it alone.
	if _, err := r.client.XClaimResult(ctx, stream, r.clientSettings.ConsumerID, r.clientSettings.ConsumerID, 0, []string{id}); err != nil {
		t.Fatal(err)
	}
	msg := redisMessageWrapper{ctx: ctx, messageID: id, message: pubsub.NewMessage{Topic: stream}, deliveries: 1}
	r.retrySoon(msg)
	if d, n := idle(); d > 5*time.Second || n != 2 {
		t.Fatalf("after the answer to an older delivery: idle %s, count %d; want it untouched (about 0, 2)", d, n)
	}
	// The answer to the current delivery makes it claimable within 2s
	// (1s, ±50 %): its idle time is set to at least 28s of the 30s.
	msg.deliveries = 2 // 2s, ±50 %: claimable within 3s
	r.retrySoon(msg)
	if d, n := idle(); d < 27*time.Second || n != 2 {
		t.Fatalf("after the answer to its delivery: idle %s, count %d; want at least 27s, 2", d, n)
	}
	for deliveries, want := range map[int64]bool{1: true, 4: true, 5: true, 6: false, 40: false} {
		// 1s doubled: 1, 2, 4, 8, 16, 32s (±50 %) against the 30s timeout.
		d, ok := r.retryAfter(deliveries)
		if deliveries <= 4 && !ok {
			t.Errorf("delivery %d: no retry before processingTimeout", deliveries)
		}
		if ok && (d < time.Second<<(deliveries-1)/2 || d >= 30*time.Second) {
			t.Errorf("delivery %d: retry after %s", deliveries, d)
		}
		if !want && ok {
			t.Errorf("delivery %d: retry after %s, want processingTimeout", deliveries, d)
		}
	}
	r.retryLimit = 0
	if d, ok := r.retryAfter(1); ok {
		t.Errorf("retryDelayLimit 0: retry after %s, want processingTimeout", d)
	}
	r.retryLimit, r.retryDelay = 32, 0
	if d, ok := r.retryAfter(1); ok {
		t.Errorf("retryDelay 0: retry after %s, want processingTimeout", d)
	}
}

// Change 14: at most retryDelayLimit messages of a stream come back soon at
// once; the others answered RETRY meanwhile wait in line and come back in
// turn, all long before processingTimeout (30s here).
func TestRetriesBeyondTheLimitWaitInLine(t *testing.T) {
	ctx, r := newStreamsWith(t, map[string]string{"processingTimeout": "30s", "redeliverInterval": "10s", "retryDelay": "100ms", "retryDelayLimit": "2", "consumerID": "workmanager"})
	const stream, total = "orders", 12
	var (
		mu       sync.Mutex
		seen     = map[string]int{}
		answered int
		most     int
	)
	if err := r.Subscribe(ctx, pubsub.SubscribeRequest{Topic: stream}, func(_ context.Context, msg *pubsub.NewMessage) error {
		mu.Lock()
		defer mu.Unlock()
		m := string(msg.Data)
		if seen[m]++; seen[m] == 1 {
			return retryAnswer(m) // every message's first delivery
		}
		answered++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for i := range total {
		if err := r.Publish(ctx, &pubsub.PublishRequest{Topic: stream, Data: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		r.givenMu.Lock()
		if l := r.retries[stream]; l != nil && l.soon > most {
			most = l.soon
		}
		r.givenMu.Unlock()
		mu.Lock()
		done := answered
		mu.Unlock()
		if done == total {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages answered RETRY came back within 20s (processingTimeout 30s)", done, total)
		}
	}
	if most > 2 {
		t.Errorf("%d messages of the stream came back soon at once, want at most retryDelayLimit (2)", most)
	}
	mu.Lock()
	defer mu.Unlock()
	for m, n := range seen {
		if n != 2 {
			t.Errorf("message %s delivered %d times, want 2", m, n)
		}
	}
	r.givenMu.Lock()
	defer r.givenMu.Unlock()
	if len(r.retries) != 0 || r.queuedRetries != 0 {
		t.Errorf("after every message came back: lines %v, %d queued; want none", r.retries, r.queuedRetries)
	}
}

// Change 14's settings: a bad retryDelay or retryDelayLimit is refused at
// Init with an error naming it; retryDelay "0" turns the change off.
func TestRetrySettingsAreChecked(t *testing.T) {
	for key, v := range map[string]string{"retryDelay": "soon", "retryDelayLimit": "many"} {
		r := NewRedisStreams(logger.NewLogger("test")).(*redisStreams)
		err := r.Init(context.Background(), pubsub.Metadata{Base: metadata.Base{Properties: map[string]string{"redisHost": "127.0.0.1:1", key: v}}})
		if err == nil || !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), strconv.Quote(v)) {
			t.Errorf("%s %q: %v; want an error naming both", key, v, err)
		}
	}
	got, err := parseDuration(map[string]string{"retryDelay": "0"}, "retryDelay", time.Second)
	if err != nil || got != 0 {
		t.Errorf("retryDelay 0: %s, %v", got, err)
	}
}

// Change 14: one topic's line holds at most maxQueuedPerStream messages,
// so the failing messages of one topic leave room in the others' lines;
// those beyond wait processingTimeout.
func TestOneTopicDoesNotFillEveryLine(t *testing.T) {
	ctx, r := newStreams(t)
	r.clientSettings.ProcessingTimeout, r.clientSettings.RedeliverInterval = 30*time.Second, 10*time.Second
	r.retryLimit = 1
	r.retries = map[string]*retryLine{"noisy": {soon: 1}, "quiet": {soon: 1}} // each with its one place taken
	for i := range maxQueuedPerStream + 100 {
		r.retrySoon(redisMessageWrapper{ctx: ctx, messageID: fmt.Sprintf("%d-0", i+1), message: pubsub.NewMessage{Topic: "noisy"}, deliveries: 1})
	}
	r.retrySoon(redisMessageWrapper{ctx: ctx, messageID: "1-0", message: pubsub.NewMessage{Topic: "quiet"}, deliveries: 1})
	r.givenMu.Lock()
	defer r.givenMu.Unlock()
	if n, q := len(r.retries["noisy"].queued), len(r.retries["quiet"].queued); n != maxQueuedPerStream || q != 1 || r.queuedRetries != n+q {
		t.Fatalf("in line: noisy %d, quiet %d, in all %d; want %d, 1, %d", n, q, r.queuedRetries, maxQueuedPerStream, maxQueuedPerStream+1)
	}
}
