package dispatch_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/delivery"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/dispatch/dispatchtest"
	"github.com/virtufin/workmanager/internal/grouplock"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/metrics"
	"github.com/virtufin/workmanager/internal/peeraddr"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
	"github.com/virtufin/workmanager/internal/state"
)

// forwardNode is one node of a two-node cluster in memory: its own broker
// (daprd), the shared store and publisher, its locks asking the other
// node's directly, its forwarded turns sent over real HTTP to the other
// node's ForwardHandler.
type forwardNode struct {
	name  string
	b     *dispatchtest.Broker
	locks *grouplock.Locks
	d     *dispatch.Dispatcher
	srv   *httptest.Server
	reg   *prometheus.Registry
	sent  atomic.Int64          // turns forwarded from here that ran there
	fail  atomic.Pointer[error] // when set, forwarding from here fails with it
}

// countingForwarder counts the turns that ran on the peer, and fails with
// its node's fail when set.
type countingForwarder struct {
	dispatch.Forwarder
	n *forwardNode
}

func (c countingForwarder) Forward(ctx context.Context, node string, req *dispatch.ForwardRequest) (*dispatch.ForwardAnswer, error) {
	if p := c.n.fail.Load(); p != nil {
		return nil, *p
	}
	ans, err := c.Forwarder.Forward(ctx, node, req)
	if err == nil && ans.Ran {
		c.n.sent.Add(1)
	}
	return ans, err
}

func forwardPair(t *testing.T, st state.Store, pub *publishtest.Recorder, key []byte) (a, b *forwardNode) {
	t.Helper()
	nodes := map[string]*forwardNode{}
	keyFn := func(context.Context) ([]byte, error) { return key, nil }
	for _, name := range []string{"n1", "n2"} {
		n := &forwardNode{name: name, b: dispatchtest.NewBroker()}
		n.locks = grouplock.New(st, grouplock.Config{RetryBase: time.Millisecond, MaxRetries: 50, Node: name, KeepFor: 64, TokenBlock: 64, Linger: time.Hour,
			HandTo: func(node, holder string) bool { return strings.HasPrefix(holder, node+"/") },
			Notify: func(ctx context.Context, node, group, holder string) grouplock.Answer {
				return nodes[node].locks.YieldIdle(ctx, group, grouplock.Asker{Node: name, Holder: holder})
			}})
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		peers := countingForwarder{dispatch.HTTPForwarder(http.DefaultClient, peeraddr.New(func(_ context.Context, node string) (string, error) {
			return strings.TrimPrefix(nodes[node].srv.URL, "http://"), nil
		}), keyFn), n}
		n.reg = prometheus.NewRegistry()
		n.d = dispatch.New(ctx, quietLog(), dispatch.Deps{Sub: n.b, Pub: pub, Events: lifecycleevents.NewEmitter(pub), Records: delivery.NewStore(st, time.Hour),
			Locks: n.locks, DeadLetters: deadletter.NewStore(st, time.Hour), Peers: peers, Metrics: metrics.New(n.reg)},
			dispatch.Config{PubSub: "pubsub", NodeID: name, MaxConcurrency: 4, QueueDepth: 64})
		n.srv = httptest.NewServer(dispatch.ForwardHandler(n.d, keyFn))
		t.Cleanup(n.srv.Close)
		nodes[name] = n
	}
	return nodes["n1"], nodes["n2"]
}

// A grouped message that reaches the node that gave the group's hold to
// the other node runs there (forwarded) instead of taking the hold back:
// every message succeeds once, the group's calls never overlap across
// the two nodes, each has a token of its own, and after the first
// hand-over the messages of the first node went to the second.
func TestForwardedTurnsRunOnTheNodeHoldingTheGroup(t *testing.T) {
	st, pub := state.NewMemoryStore(), &publishtest.Recorder{}
	a, b := forwardPair(t, st, pub, []byte("0123456789abcdef0123456789abcdef"))
	var inside, overlaps atomic.Int32
	var mu sync.Mutex
	ranOn := map[string]string{}
	tokens := map[string]bool{}
	body := func(node string) func(*event.Event) ([]event.Event, error) {
		return func(in *event.Event) ([]event.Event, error) {
			if inside.Add(1) > 1 {
				overlaps.Add(1)
			}
			time.Sleep(100 * time.Microsecond)
			inside.Add(-1)
			mu.Lock()
			ranOn[in.ID()] = node
			tokens[in.Extensions()[dispatch.FencingExtension].(string)] = true
			mu.Unlock()
			return outputs("out")(in)
		}
	}
	for _, n := range []*forwardNode{a, b} {
		n.d.Attach(dispatch.Worker{ID: "w", Topic: "in", Group: "g"}, &dispatchtest.FuncInstance{Fn: body(n.name)})
	}
	sa, sb := waitStream(t, a.b, "in"), waitStream(t, b.b, "in")
	const n = 40
	for i := range n {
		node, s := a, sa
		if i%2 == 1 {
			node, s = b, sb
		}
		s.In <- request(fmt.Sprintf("m%d", i), "")
		if ack := waitAck(t, node.b); ack.Status != dispatch.AckSuccess {
			t.Fatalf("m%d on %s: ack %+v", i, node.name, ack)
		}
	}
	if overlaps.Load() != 0 {
		t.Fatalf("%d overlapping calls of one group across two nodes", overlaps.Load())
	}
	if len(ranOn) != n || len(tokens) != n {
		t.Fatalf("%d messages ran, with %d distinct tokens; want %d of each", len(ranOn), len(tokens), n)
	}
	if got := len(pub.On("out")); got != n {
		t.Fatalf("%d outputs, want %d (one per message, none twice)", got, n)
	}
	// m0 took the lock on n1, m1 had it handed to n2; from m2 on, n1's
	// messages went to n2, which kept the group.
	if a.sent.Load() != n/2-1 || b.sent.Load() != 0 {
		t.Fatalf("forwarded: from n1 %d, from n2 %d; want %d and 0", a.sent.Load(), b.sent.Load(), n/2-1)
	}
	for i := 2; i < n; i++ {
		if on := ranOn[fmt.Sprintf("m%d", i)]; on != "n2" {
			t.Fatalf("m%d ran on %s, want n2 (the node holding the group)", i, on)
		}
	}
	// Received and succeeded once each, where daprd delivered them; the
	// outputs where they were published.
	var received, succeeded, outs float64
	for _, n := range []*forwardNode{a, b} {
		fams, err := n.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			for _, m := range f.Metric {
				switch f.GetName() {
				case "workmanager_worker_messages_received_total":
					received += value(m)
				case "workmanager_worker_messages_processed_total":
					succeeded += value(m)
				case "workmanager_worker_outputs_published_total":
					outs += value(m)
				}
			}
		}
	}
	if received != n || succeeded != n || outs != n {
		t.Fatalf("the two nodes counted %v received, %v succeeded, %v outputs; want %d each", received, succeeded, outs, n)
	}
	// Each message's record is its receiving node's, done for the worker.
	for i := range n {
		rec, err := delivery.NewStore(st, time.Hour).Load(context.Background(), delivery.Key("test", fmt.Sprintf("m%d", i)))
		if err != nil || !rec.Get("w").Terminal() {
			t.Fatalf("m%d: record %+v (%v), want the worker done", i, rec.Get("w"), err)
		}
	}
}

// A forwarded turn that fails is an attempt of the node that received
// the message: its retries and its dead letter are that node's, with the
// failure's reason and error as the node that ran it saw them.
func TestForwardedFailureIsTheSendersAttempt(t *testing.T) {
	st, pub := state.NewMemoryStore(), &publishtest.Recorder{}
	a, b := forwardPair(t, st, pub, []byte("0123456789abcdef0123456789abcdef"))
	fail := func(in *event.Event) ([]event.Event, error) {
		if in.ID() == "bad" {
			return nil, fmt.Errorf("%w: boom", engines.ErrWorkerFailed)
		}
		return outputs("out")(in)
	}
	for _, n := range []*forwardNode{a, b} {
		n.d.Attach(dispatch.Worker{ID: "w", Topic: "in", Group: "g", MaxAttempts: 2}, &dispatchtest.FuncInstance{Fn: fail})
	}
	sa, sb := waitStream(t, a.b, "in"), waitStream(t, b.b, "in")
	sa.In <- request("m0", "")
	waitAck(t, a.b)
	sb.In <- request("m1", "") // handed to n2
	waitAck(t, b.b)
	for i, want := range []dispatch.Ack{dispatch.AckRetry, dispatch.AckSuccess} {
		sa.In <- request("bad", "")
		if ack := waitAck(t, a.b); ack.Status != want {
			t.Fatalf("bad, delivery %d on n1: %+v, want %v", i+1, ack, want)
		}
	}
	if a.sent.Load() != 2 {
		t.Fatalf("%d turns forwarded, want 2", a.sent.Load())
	}
	dead := pub.On("in-dead")
	if len(dead) != 1 || dead[0].Extensions()[dispatch.DeadLetterReasonExtension] != string(deadletter.ReasonWorkerFailed) ||
		!strings.Contains(fmt.Sprint(dead[0].Extensions()[dispatch.DeadLetterErrorExtension]), "boom") {
		t.Fatalf("dead letters %v", dead)
	}
}

// A peer that does not run the turn (ErrNotForwarded, or Ran false) leaves
// it to the sender, which takes the lock itself; one whose answer never
// comes leaves the attempt undecided: given back, not counted.
func TestForwardFallsBackOrGivesBack(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want dispatch.Ack
	}{
		{"refused", fmt.Errorf("%w: test", dispatch.ErrNotForwarded), dispatch.AckSuccess},
		{"no answer", errors.New("connection reset"), dispatch.AckRetry},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, pub := state.NewMemoryStore(), &publishtest.Recorder{}
			a, b := forwardPair(t, st, pub, []byte("0123456789abcdef0123456789abcdef"))
			for _, n := range []*forwardNode{a, b} {
				n.d.Attach(dispatch.Worker{ID: "w", Topic: "in", Group: "g", MaxAttempts: 1}, &dispatchtest.FuncInstance{Fn: outputs("out")})
			}
			sa, sb := waitStream(t, a.b, "in"), waitStream(t, b.b, "in")
			sa.In <- request("m0", "")
			waitAck(t, a.b)
			sb.In <- request("m1", "")
			waitAck(t, b.b)
			a.fail.Store(&tc.err)
			sa.In <- request("m2", "")
			if ack := waitAck(t, a.b); ack.Status != tc.want {
				t.Fatalf("m2: %+v, want %v", ack, tc.want)
			}
			rec, _ := delivery.NewStore(st, time.Hour).Load(context.Background(), delivery.Key("test", "m2"))
			if tc.want == dispatch.AckRetry && (rec.Get("w").Attempts != 0 || len(pub.On("in-dead")) != 0) {
				t.Fatalf("an unanswered forward counted as an attempt: %+v, dead %d", rec.Get("w"), len(pub.On("in-dead")))
			}
		})
	}
}

// The forward endpoint refuses what a stranger can send: no signature or
// a wrong one, an old request, a body over its bound, a signed request
// sent again; and a signed request for a worker that is not attached here
// is not run.
func TestForwardHandlerRefusesStrangers(t *testing.T) {
	st, pub := state.NewMemoryStore(), &publishtest.Recorder{}
	key := []byte("0123456789abcdef0123456789abcdef")
	a, _ := forwardPair(t, st, pub, key)
	a.d.Attach(dispatch.Worker{ID: "w", Topic: "in", Group: "g"}, &dispatchtest.FuncInstance{Fn: outputs("out")})
	waitStream(t, a.b, "in")
	ev, _ := proto.Marshal(request("x", ""))
	post := func(req dispatch.ForwardRequest, sign []byte, tamper func(*http.Request)) (int, string) {
		if sign == nil {
			sign = []byte("unused")
		}
		hr, err := dispatch.NewForwardRequest(context.Background(), a.srv.URL, sign, &req)
		if err != nil {
			t.Fatal(err)
		}
		if tamper != nil {
			tamper(hr)
		}
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var sb bytes.Buffer
		_, _ = sb.ReadFrom(resp.Body)
		return resp.StatusCode, sb.String()
	}
	unsigned := func(hr *http.Request) { hr.Header.Del(dispatch.ForwardSignatureHeader) }
	good := dispatch.ForwardRequest{Worker: "w", Topic: "in", Lock: "g", Attempt: 1, Event: ev, SentMs: time.Now().UnixMilli()}
	if code, _ := post(good, key, unsigned); code != http.StatusUnauthorized {
		t.Fatalf("unsigned: %d", code)
	}
	if code, _ := post(good, []byte("another key of 32 bytes, not it!"), nil); code != http.StatusUnauthorized {
		t.Fatalf("wrong key: %d", code)
	}
	if code, _ := post(good, key, func(hr *http.Request) { hr.Header.Set("X-Workmanager-Attempt", "2") }); code != http.StatusUnauthorized {
		t.Fatalf("a field changed after signing: %d", code)
	}
	old := good
	old.SentMs = time.Now().Add(-time.Minute).UnixMilli()
	if code, _ := post(old, key, nil); code != http.StatusBadRequest {
		t.Fatalf("a minute old: %d", code)
	}
	big := good
	big.Event = bytes.Repeat([]byte("x"), 4<<20)
	if code, _ := post(big, key, nil); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("4 MiB: %d", code)
	}
	long := good
	long.Lock = strings.Repeat("g", 2000)
	if code, _ := post(long, key, nil); code != http.StatusBadRequest {
		t.Fatalf("a 2,000-byte lock name: %d", code)
	}
	other := good
	other.Worker = "nobody"
	if code, body := post(other, key, nil); code != http.StatusOK || !strings.Contains(body, `"ran":false`) {
		t.Fatalf("unknown worker: %d %s", code, body)
	}
	wrongLock := good
	wrongLock.Lock = "h"
	if code, body := post(wrongLock, key, nil); code != http.StatusOK || !strings.Contains(body, `"ran":false`) {
		t.Fatalf("another lock: %d %s", code, body)
	}
	if code, body := post(good, key, nil); code != http.StatusOK || !strings.Contains(body, `"outcome":"done"`) {
		t.Fatalf("signed: %d %s", code, body)
	}
	if code, _ := post(good, key, nil); code != http.StatusConflict {
		t.Fatalf("the same signed request again (a replay): %d", code)
	}
	if got := len(pub.On("out")); got != 1 {
		t.Fatalf("%d outputs, want 1 (the signed request's)", got)
	}
}
