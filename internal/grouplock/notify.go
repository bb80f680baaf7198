package grouplock

// The HTTP transport of Config.Notify and Config.Tell: a node asks the
// node that holds a group to give up a hold that only lingers there
// (YieldIdle), and a node that gave a lock up for a peer's waiter marker
// tells that peer (Freed), on the other node's HTTP address (its
// advertisement). Nodes share one Dapr app id, so
// a pub/sub topic reaches one of them, not the one that holds the lock:
// the question goes to the holder directly.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/virtufin/workmanager/internal/peeraddr"
)

// YieldPath is where a node answers its peers' Config.Notify: POST, form
// value "lock" (a lock name, at most MaxLockNameBytes) and, optionally,
// "node" (the asking node's Config.Node, at most MaxNodeNameBytes: the
// answering node asks it first when it wants the lock back, YieldIdle)
// and "holder" (the holder the asker acquires for, at most
// MaxHolderBytes: with node, the hold may be handed to it,
// Config.HandTo), answered 200 with an Answer: {"released": bool,
// "handed": {"token", "first", "acquired_ms", "etag"}}. Anyone who can reach the
// node's HTTP address can ask; the worst an answer does is give up a hold
// nobody on the node uses (its next message acquires the lock again) —
// handed to a live node that did not ask, the lock is freed by that node
// at the next question, or taken over by its next message —, never a
// lease in use.
const YieldPath = "/internal/grouplock/yield"

// MaxLockNameBytes bounds the lock name a yield request may carry,
// MaxNodeNameBytes its asking node's name, MaxHolderBytes its holder.
const (
	MaxLockNameBytes = 1024
	MaxNodeNameBytes = 256
	MaxHolderBytes   = 1024
)

// FreedPath is where a node hears from a peer that the group lock named
// by the form value "lock" (at most MaxLockNameBytes) was just given up
// for this node's waiter marker (Config.Tell, Locks.Freed): POST,
// answered 204. Anyone who can reach the node's HTTP address can send it;
// the worst it does is make this node's Acquires of that lock, if any
// wait here, read the record once before their next look.
const FreedPath = "/internal/grouplock/freed"

// Handler serves a node's peers: YieldPath and FreedPath for l.
func Handler(l *Locks) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST "+YieldPath, YieldHandler(l))
	mux.Handle("POST "+FreedPath, FreedHandler(l))
	return mux
}

// FreedHandler serves FreedPath for l.
func FreedHandler(l *Locks) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, lock, ok := lockForm(w, r, "freed", 3*MaxLockNameBytes+64) // one name, form-encoded
		if !ok {
			return
		}
		l.Freed(lock)
		w.WriteHeader(http.StatusNoContent)
	})
}

// lockForm parses r's form (at most limit bytes) and its "lock" value,
// answering 400 with what is wrong (ok false) when it is missing or past
// MaxLockNameBytes; what names the endpoint in the answer.
func lockForm(w http.ResponseWriter, r *http.Request, what string, limit int64) (form url.Values, lock string, ok bool) {
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "grouplock "+what+": "+err.Error(), http.StatusBadRequest)
		return nil, "", false
	}
	lock = r.PostForm.Get("lock")
	switch {
	case lock == "":
		http.Error(w, "grouplock "+what+`: the form value "lock" (a lock name) is missing`, http.StatusBadRequest)
		return nil, "", false
	case len(lock) > MaxLockNameBytes:
		http.Error(w, fmt.Sprintf("grouplock %s: a lock name of %d bytes, more than %d", what, len(lock), MaxLockNameBytes), http.StatusBadRequest)
		return nil, "", false
	}
	return r.PostForm, lock, true
}

// YieldHandler serves YieldPath for l.
func YieldHandler(l *Locks) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		form, lock, ok := lockForm(w, r, "yield", 3*(MaxLockNameBytes+MaxNodeNameBytes+MaxHolderBytes)+64) // three names, form-encoded
		if !ok {
			return
		}
		node := form.Get("node")
		if len(node) > MaxNodeNameBytes {
			http.Error(w, fmt.Sprintf("grouplock yield: a node name of %d bytes, more than %d", len(node), MaxNodeNameBytes), http.StatusBadRequest)
			return
		}
		holder := form.Get("holder")
		if len(holder) > MaxHolderBytes {
			http.Error(w, fmt.Sprintf("grouplock yield: a holder of %d bytes, more than %d", len(holder), MaxHolderBytes), http.StatusBadRequest)
			return
		}
		ans := l.YieldIdle(r.Context(), lock, Asker{Node: node, Holder: holder})
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(ans)
	})
}

// quietAfterFailure is how long HTTPNotifier asks nothing of a node whose
// last question failed or timed out (paused, partitioned, restarting): a
// waiting node then waits as it would without asking, instead of paying
// a timeout on every try.
const quietAfterFailure = 5 * time.Second

// NotifyClient is the HTTP client HTTPNotifier is meant for: each
// question bounded by NotifyTimeout, and a connection to a peer closed
// after a second without questions, so that an idle cluster holds no
// connections (nor their goroutines) between its nodes.
func NotifyClient() *http.Client {
	return &http.Client{Timeout: NotifyTimeout, Transport: &http.Transport{
		Proxy:               nil, // peers are reached directly
		DialContext:         (&net.Dialer{Timeout: NotifyTimeout}).DialContext,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     time.Second,
		DisableCompression:  true,
	}}
}

// HTTPNotifier is Config.Notify over HTTP for the node named self (its
// Config.Node, sent with each question), at the addresses addrs finds (a
// node that advertises none is not asked); a node whose question failed
// or timed out is not asked again for quietAfterFailure (addrs.Quiet),
// and its address is looked up again after. Callers bound each question
// (Config.Notify: NotifyTimeout).
func HTTPNotifier(client *http.Client, self string, addrs *peeraddr.Cache) func(ctx context.Context, node, group, holder string) Answer {
	n := &notifier{client: client, self: self, addrs: addrs}
	return n.notify
}

type notifier struct {
	client *http.Client
	self   string
	addrs  *peeraddr.Cache
}

func (n *notifier) notify(ctx context.Context, node, group, holder string) Answer {
	addr := n.addrs.Addr(ctx, node)
	if addr == "" {
		return Answer{}
	}
	ans, err := n.ask(ctx, addr, group, holder)
	if err != nil {
		n.addrs.Quiet(node, quietAfterFailure)
		return Answer{}
	}
	return ans
}

// HTTPTeller is Config.Tell over HTTP, at the addresses addrs finds (as
// HTTPNotifier: a node that advertises none is not told, and one that
// failed is left quiet for a while). Callers bound each call.
func HTTPTeller(client *http.Client, addrs *peeraddr.Cache) func(ctx context.Context, node, group string) {
	n := &notifier{client: client, addrs: addrs}
	return n.tell
}

func (n *notifier) tell(ctx context.Context, node, group string) {
	addr := n.addrs.Addr(ctx, node)
	if addr == "" {
		return
	}
	resp, err := n.post(ctx, addr, FreedPath, url.Values{"lock": {group}})
	if err != nil {
		n.addrs.Quiet(node, quietAfterFailure)
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1024))
	resp.Body.Close()
}

// post sends form to path at the peer addr.
func (n *notifier) post(ctx context.Context, addr, path string, form url.Values) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return n.client.Do(req)
}

func (n *notifier) ask(ctx context.Context, addr, group, holder string) (Answer, error) {
	form := url.Values{"lock": {group}}
	if n.self != "" {
		form.Set("node", n.self)
		if holder != "" {
			form.Set("holder", holder)
		}
	}
	resp, err := n.post(ctx, addr, YieldPath, form)
	if err != nil {
		return Answer{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Answer{}, fmt.Errorf("grouplock yield at %s: %s", addr, resp.Status)
	}
	var ans Answer
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1024)).Decode(&ans); err != nil {
		return Answer{}, err
	}
	return ans, nil
}

// ValidateAdvertiseAddr checks a node's advertised HTTP address: host:port
// with a host its peers can reach (not empty, 0.0.0.0 or ::).
func ValidateAdvertiseAddr(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %w", a, err)
	}
	if port == "" || port == "0" {
		return fmt.Errorf("%q has no port", a)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		return errors.New("the host of " + a + " is a wildcard, which no peer can reach: name this node's address")
	}
	return nil
}
