package grouplock

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/peeraddr"
)

// The HTTP transport of Config.Notify: YieldHandler gives up a lingering
// hold for the asking peer and answers whether it did; a request without a
// lock name or with one past MaxLockNameBytes is refused with a message
// saying so; HTTPNotifier asks the address its lookup gives, asks nobody
// for a node without one, and looks a node up again after a failure.
func TestYieldOverHTTP(t *testing.T) {
	w := newWorld(t)
	a := w.node(nil, func(c *Config) { c.Node, c.KeepFor, c.TokenBlock, c.Linger = "a", 100, 100, time.Hour })
	srv := httptest.NewServer(YieldHandler(a.Locks))
	t.Cleanup(srv.Close)
	post := func(form url.Values) (int, string) {
		t.Helper()
		resp, err := http.PostForm(srv.URL+YieldPath, form)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	for name, c := range map[string]struct {
		form url.Values
		want string
	}{
		"no lock":   {url.Values{}, `the form value "lock" (a lock name) is missing`},
		"long lock": {url.Values{"lock": {strings.Repeat("g", MaxLockNameBytes+1)}}, "a lock name of 1025 bytes, more than 1024"},
		"long node": {url.Values{"lock": {"g"}, "node": {strings.Repeat("n", MaxNodeNameBytes+1)}}, "a node name of 257 bytes, more than 256"},
		"long holder": {url.Values{"lock": {"g"}, "node": {"b"}, "holder": {strings.Repeat("h", MaxHolderBytes+1)}},
			"a holder of 1025 bytes, more than 1024"},
		"huge body": {url.Values{"lock": {strings.Repeat("g", 1<<20)}}, "request body too large"},
	} {
		if code, body := post(c.form); code != http.StatusBadRequest || !strings.Contains(body, c.want) {
			t.Errorf("%s: %d %q, want 400 saying %q", name, code, body, c.want)
		}
	}
	if code, body := post(url.Values{"lock": {"g"}}); code != http.StatusOK || body != `{"released":false}` {
		t.Fatalf("no hold: %d %s", code, body)
	}

	var lookups atomic.Int32
	addr := strings.TrimPrefix(srv.URL, "http://")
	notify := HTTPNotifier(srv.Client(), "b", peeraddr.New(func(_ context.Context, node string) (string, error) {
		lookups.Add(1)
		switch node {
		case "a":
			return addr, nil
		case "gone":
			return "127.0.0.1:1", nil // nobody listens
		}
		return "", nil
	}))
	ctx := context.Background()
	mustRelease(t, mustAcquire(t, a, "g", "a/1"))
	if ans := notify(ctx, "a", "g", "b/1"); !ans.Released || ans.Handed != nil {
		t.Fatalf("a lingering hold, a without HandTo: %+v, want released and not handed", ans)
	}
	a.mu.Lock()
	handed := a.handedTo["g"]
	a.mu.Unlock()
	if handed.node != "b" {
		t.Fatalf("a gave g up to %q, want the asking node b", handed.node)
	}
	if r := w.record("g"); r.Held {
		t.Fatalf("record %+v after the yield", r)
	}
	if notify(ctx, "a", "g", "").Released || lookups.Load() != 1 {
		t.Fatalf("second question: released, or %d lookups (want the address remembered)", lookups.Load())
	}
	if notify(ctx, "nobody", "g", "").Released {
		t.Fatal("a node without an address answered")
	}
	if notify(ctx, "gone", "g", "").Released || notify(ctx, "gone", "g", "").Released {
		t.Fatal("an unreachable node answered")
	}
	if n := lookups.Load(); n != 3 { // a, nobody, gone once: not asked again for a while after failing
		t.Fatalf("%d lookups, want 3", n)
	}

	// With HandTo, the hold is handed to the asker over HTTP: the answer
	// carries the record's tokens, and the record names the asker.
	a.cfg.HandTo = func(node, holder string) bool { return node == "b" && strings.HasPrefix(holder, "b/") }
	mustRelease(t, mustAcquire(t, a, "g", "a/2"))
	before := w.record("g")
	ans := notify(ctx, "a", "g", "b/7")
	r := w.record("g")
	if !ans.Released || ans.Handed == nil || ans.Handed.Token != r.Token || ans.Handed.First != before.Token+1 || ans.Handed.AcquiredMs != r.AcquiredMs {
		t.Fatalf("hand-over answer %+v, record %+v after %+v", ans, r, before)
	}
	if !r.Held || r.Holder != "b/7" || r.Node != "b" || !r.Wrote {
		t.Fatalf("record %+v after the hand-over, want held by b/7 on b, wrote", r)
	}
	// A node that does not answer (paused) costs the asker the caller's
	// bound once, then nothing for a while.
	stuck := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-stuck }))
	t.Cleanup(func() { close(stuck); hung.Close() })
	paused := HTTPNotifier(hung.Client(), "b", peeraddr.New(func(context.Context, string) (string, error) { return strings.TrimPrefix(hung.URL, "http://"), nil }))
	for i := range 3 {
		start := time.Now()
		qctx, cancel := context.WithTimeout(ctx, NotifyTimeout)
		if paused(qctx, "p", "g", "b/1").Released {
			t.Fatal("a paused node answered")
		}
		cancel()
		if took := time.Since(start); took > NotifyTimeout+time.Second || i > 0 && took > NotifyTimeout/2 {
			t.Fatalf("question %d took %v", i, took)
		}
	}
}

func TestValidateAdvertiseAddr(t *testing.T) {
	for a, ok := range map[string]bool{"127.0.0.1:8080": true, "node-1.svc:8080": true, "[::1]:80": true,
		"0.0.0.0:8080": false, ":8080": false, "[::]:8080": false, "node-1": false, "node-1:": false, "node-1:0": false} {
		if err := ValidateAdvertiseAddr(a); (err == nil) != ok {
			t.Errorf("%q: %v, want ok %v", a, err, ok)
		}
	}
}

// An idle cluster holds no connections between its nodes: NotifyClient
// closes a connection a second after its last question (each one is two
// goroutines on the asking node and one on the asked).
func TestNotifyClientClosesIdleConnections(t *testing.T) {
	w := newWorld(t)
	a := w.node(nil, func(c *Config) { c.Node, c.KeepFor, c.Linger = "a", 100, time.Hour })
	var open atomic.Int32
	srv := httptest.NewUnstartedServer(YieldHandler(a.Locks))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	notify := HTTPNotifier(NotifyClient(), "b", peeraddr.New(func(context.Context, string) (string, error) { return strings.TrimPrefix(srv.URL, "http://"), nil }))
	for range 3 {
		notify(context.Background(), "a", "g", "")
	}
	if open.Load() == 0 {
		t.Fatal("no connection was made")
	}
	for deadline := time.Now().Add(10 * time.Second); open.Load() != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still open 10 s after the last question", open.Load())
		}
	}
}

// The HTTP transport of Config.Tell: FreedHandler refuses a request
// without a lock name or with one past MaxLockNameBytes, saying so, and
// answers 204 otherwise (a lock nobody here waits for included);
// HTTPTeller reaches it, and an Acquire waiting there between two looks
// takes the freed lock at once instead of at its next look.
func TestFreedOverHTTP(t *testing.T) {
	w := newWorld(t)
	a := w.node(nil, func(c *Config) { c.Node = "a" })
	sl := &blockingSleep{}
	b := w.node(nil, func(c *Config) {
		c.Node, c.KeepFor, c.FairEvery, c.RetryBase, c.Sleep = "b", 10, 5*time.Second, time.Hour, sl.Sleep
	})
	srv := httptest.NewServer(Handler(b.Locks))
	t.Cleanup(srv.Close)
	for name, c := range map[string]struct {
		form url.Values
		want string
	}{
		"no lock":   {url.Values{}, `the form value "lock" (a lock name) is missing`},
		"long lock": {url.Values{"lock": {strings.Repeat("g", MaxLockNameBytes+1)}}, "a lock name of 1025 bytes, more than 1024"},
		"huge body": {url.Values{"lock": {strings.Repeat("g", 1<<20)}}, "request body too large"},
	} {
		resp, err := http.PostForm(srv.URL+FreedPath, c.form)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), c.want) {
			t.Errorf("%s: %d %q, want 400 saying %q", name, resp.StatusCode, body, c.want)
		}
	}
	if resp, err := http.PostForm(srv.URL+FreedPath, url.Values{"lock": {"nobody-waits"}}); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("freed, nobody waiting: %v %v", resp, err)
	}
	b.mu.Lock()
	kept := len(b.looks)
	b.mu.Unlock()
	if kept != 0 {
		t.Fatalf("%d groups kept after a Freed nobody waited for", kept)
	}

	held := mustAcquire(t, a, "g", "a/1")
	got := acquireLater(t, b.Locks, "g", "b/1")
	b.waitWaiting(t, "g")
	mustRelease(t, held) // a has no Tell: told below, over HTTP
	tell := HTTPTeller(srv.Client(), peeraddr.New(func(_ context.Context, node string) (string, error) {
		if node == "b" {
			return strings.TrimPrefix(srv.URL, "http://"), nil
		}
		return "", nil
	}))
	ctx, cancel := context.WithTimeout(context.Background(), NotifyTimeout)
	defer cancel()
	tell(ctx, "b", "g")
	ls := <-got
	if ls == nil {
		t.Fatal("b took no lease")
	}
	mustRelease(t, ls)
	if n := sl.full.Load(); n != 0 {
		t.Fatalf("b slept %d full steps of 5 s", n)
	}
}
