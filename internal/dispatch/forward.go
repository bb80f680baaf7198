package dispatch

// Stage 3, for a grouped worker whose group another node holds: the turn
// forwarded there. Nodes share one consumer group, so the messages of a
// group reach whichever node daprd hands them to; a node that gave its
// hold of the group (or of a key) to another node within the linger
// (grouplock.Locks.HeldAt) does not ask for the hold back at its next
// message of the group (a question and a write for every change of node):
// it sends the attempt to that node, which runs it as one of its own
// turns — the lease of its hold, the call, the outputs (lock.go, call.go,
// outputs.go) — and answers with the outcome. The message's delivery
// record, its retries and its dead letter stay with the node that
// received it (record.go, settle.go): a forwarded turn is an attempt like
// any other. A node that does not run it (no such worker there, draining,
// its queue full, a request it cannot check) says so, and the sender takes
// the lock itself as before; an answer that never comes leaves the
// attempt undecided: the message is given back, not counted as an
// attempt (the peer may have run it: at least once, as after a crash).

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
	"google.golang.org/protobuf/proto"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/peeraddr"
)

// ForwardPath is where a node runs the turns its peers forward (POST,
// NewForwardRequest: the event as the body, the rest in headers, signed:
// ForwardSignatureHeader), answered with a ForwardAnswer as JSON.
const ForwardPath = "/internal/dispatch/forward"

// ForwardSignatureHeader carries a forwarded turn's signature: the hex
// HMAC-SHA256 of its fields and event under the cluster's peer key
// (forwardMAC).
const ForwardSignatureHeader = "X-Workmanager-Signature"

// forwardMaxAge bounds how old a forwarded turn may be when it arrives
// (its SentMs, by the receiving node's clock): a captured request cannot
// be sent again later.
const forwardMaxAge = 30 * time.Second

// ForwardRequest is one forwarded turn: the attempt of worker Worker (on
// Topic, its lock Lock) at the event daprd delivered (Event: the
// TopicEventRequest, protobuf).
type ForwardRequest struct {
	Worker, Topic, Lock string
	Attempt             int32
	Event               []byte
	SentMs              int64
}

// ForwardAnswer is how a forwarded turn ended. Ran false: it was not run
// there, and the sender runs it; otherwise Outcome is done, failed, cut or
// deferred (as settle.go counts them), with the failure's Reason and Error
// and, when the worker answered with an error, its message (Answered).
type ForwardAnswer struct {
	Ran       bool    `json:"ran"`
	Why       string  `json:"why,omitempty"` // why it was not run
	Outcome   string  `json:"outcome,omitempty"`
	Reason    string  `json:"reason,omitempty"`
	Error     string  `json:"error,omitempty"`
	Traceback string  `json:"traceback,omitempty"`
	Answered  *string `json:"answered,omitempty"`
}

// Forwarder sends forwarded turns to the node that holds their group
// (Deps.Peers). Forward returns an error wrapping ErrNotForwarded when the
// request surely did not run there (no address, refused, not sent).
type Forwarder interface {
	Forward(ctx context.Context, node string, req *ForwardRequest) (*ForwardAnswer, error)
}

// ErrNotForwarded: a turn that was not sent, or that the peer refused
// before running it.
var ErrNotForwarded = errors.New("turn not forwarded")

// outcomeNames are the outcomes as a ForwardAnswer names them.
var outcomeNames = map[outcome]string{outcomeDone: "done", outcomeFailed: "failed", outcomeCut: "cut", outcomeDeferred: "deferred"}

// outcomeNamed is the outcome named s (outcomeNone for a name it does not
// know).
func outcomeNamed(s string) outcome {
	for o, name := range outcomeNames {
		if name == s {
			return o
		}
	}
	return outcomeNone
}

// forwardTurn sends w's attempt at j's message to node, which holds lock,
// and ends the attempt with its answer; false when node did not run it
// (the caller takes the lock itself).
func (d *Dispatcher) forwardTurn(ctx context.Context, w *worker, j *job, lock, node string) bool {
	m, r := j.m, j.r
	ev, err := proto.Marshal(m.req)
	if err != nil {
		return false
	}
	sctx, stopCancel := w.untilStopped(ctx) // a stop ends the wait, as for the lock (acquire)
	defer stopCancel()
	fctx, cancel := context.WithTimeout(sctx, d.cfg.ForwardTimeout)
	defer cancel()
	ans, err := d.Peers.Forward(fctx, node, &ForwardRequest{Worker: w.ID, Topic: w.Topic, Lock: lock, Attempt: r.attempt, Event: ev, SentMs: time.Now().UnixMilli()})
	if err == nil && !ans.Ran || errors.Is(err, ErrNotForwarded) {
		d.Locks.Forwarded(lock, node, false)
		why := ""
		if err != nil {
			why = err.Error()
		} else {
			why = ans.Why
		}
		d.log.Debug("turn not run on the node holding its group: taking the lock here", "group", w.Group, "worker_id", w.ID, "node", node, "why", why)
		return false
	}
	if err != nil {
		// Sent, and no answer: it may have run there. Given back, not an
		// attempt; the node is not asked again until it runs one.
		d.Locks.Forwarded(lock, node, false)
		r.outcome = outcomeDeferred
		if w.isStopped() {
			r.outcome = outcomeCut
		}
		d.log.Warn("a turn forwarded to the node holding its group got no answer; the message is given back, not counted as an attempt",
			append([]any{"group", w.Group, "worker_id", w.ID, "node", node, "err", err}, logAttrs(m, r.trace)...)...)
		d.finish(w, j)
		return true
	}
	d.Locks.Forwarded(lock, node, true)
	w.m.Forwarded.Inc() // a grouped worker's: set
	switch o := outcomeNamed(ans.Outcome); o {
	case outcomeDone, outcomeCut, outcomeDeferred:
		r.outcome = o
	default:
		r.outcome, r.reason = outcomeFailed, deadletter.Reason(ans.Reason)
		if r.reason == "" {
			r.reason = deadletter.ReasonInternal
		}
		r.err = &forwardedError{text: fmt.Sprintf("on node %s: %s", node, ans.Error), traceback: ans.Traceback}
	}
	if ans.Answered != nil {
		r.answered = &engines.ErrorAnswer{Message: *ans.Answered}
	}
	d.finish(w, j)
	return true
}

// runForwarded runs a peer's forwarded turn here, as a turn of this node's
// worker req.Worker, and waits for its outcome.
func (d *Dispatcher) runForwarded(ctx context.Context, req *ForwardRequest) *ForwardAnswer {
	if d.draining.Load() || !d.serving() {
		return &ForwardAnswer{Why: "this node does not serve messages now"}
	}
	d.mu.Lock()
	t := d.topics[req.Topic]
	d.mu.Unlock()
	var w *worker
	if t != nil {
		for _, x := range *t.workers.Load() {
			if x.ID == req.Worker {
				w = x
			}
		}
	}
	if w == nil || w.lock == "" || t.closing.Load() {
		return &ForwardAnswer{Why: fmt.Sprintf("worker %s is not attached here with a group on topic %q", req.Worker, req.Topic)}
	}
	var er runtimev1.TopicEventRequest
	if err := proto.Unmarshal(req.Event, &er); err != nil {
		return &ForwardAnswer{Why: "the event does not decode: " + err.Error()}
	}
	m := &message{t: t, id: er.GetId(), req: &er, remote: make(chan struct{})}
	if _, err := d.admit(m, nil); err != nil {
		return &ForwardAnswer{Why: err.Error()}
	}
	if m.replayFor != "" || w.lockFor(m) != req.Lock {
		return &ForwardAnswer{Why: fmt.Sprintf("the event takes lock %q here, not %q", w.lockFor(m), req.Lock)}
	}
	d.flight(t, 1)
	defer d.flight(t, -1)
	m.started = mono()
	m.results = []result{{w: w, queued: mono(), attempt: req.Attempt}}
	r := &m.results[0]
	m.pending.Store(1) // this call's hold; the job takes its own
	if !w.offer(m, r, d.cfg.QueueWait) {
		// The group's calls run here: a full queue gives the message back
		// for the worker, as it would on the sending node.
		w.m.QueueRejection.Inc()
		return &ForwardAnswer{Ran: true, Outcome: "deferred"}
	}
	d.leave(m)
	select {
	case <-m.remote:
	case <-ctx.Done():
		// The sender gave up: the turn still ends here (its lease and
		// outputs as for any), unanswered.
		return &ForwardAnswer{Why: "the sender went away"}
	}
	ans := &ForwardAnswer{Ran: true, Outcome: outcomeNames[r.outcome], Reason: string(r.reason)}
	if ans.Outcome == "" {
		ans.Outcome = outcomeNames[outcomeCut] // ended without an outcome: not an attempt
	}
	if r.err != nil {
		ans.Error, ans.Traceback = d.publicText(r.err.Error()), d.publicTraceback(engines.Traceback(r.err))
	}
	if r.answered != nil {
		msg := r.answered.Message
		ans.Answered = &msg
	}
	return ans
}

// forwardedError is a failed attempt's error as the node that ran it
// told (its text and the worker's traceback).
type forwardedError struct{ text, traceback string }

func (e *forwardedError) Error() string           { return e.text }
func (e *forwardedError) WorkerTraceback() string { return e.traceback }

// The headers of a forwarded turn; its body is the event (protobuf).
const (
	forwardWorkerHeader  = "X-Workmanager-Worker"
	forwardTopicHeader   = "X-Workmanager-Topic"
	forwardLockHeader    = "X-Workmanager-Lock"
	forwardAttemptHeader = "X-Workmanager-Attempt"
	forwardSentHeader    = "X-Workmanager-Sent"
)

// maxForwardNameBytes bounds a forwarded turn's worker, topic and lock
// names.
const maxForwardNameBytes = 1024

// NewForwardRequest is the HTTP request of a forwarded turn to the node at
// url (its scheme and address), signed under key: the event is the body
// as it is (no encoding: the turn's cost is the event's bytes), the rest
// headers, all of it under the signature (ForwardSignatureHeader).
func NewForwardRequest(ctx context.Context, url string, key []byte, req *ForwardRequest) (*http.Request, error) {
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, url+ForwardPath, bytes.NewReader(req.Event))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Content-Type", "application/protobuf")
	hr.Header.Set(forwardWorkerHeader, req.Worker)
	hr.Header.Set(forwardTopicHeader, req.Topic)
	hr.Header.Set(forwardLockHeader, req.Lock)
	hr.Header.Set(forwardAttemptHeader, strconv.FormatInt(int64(req.Attempt), 10))
	hr.Header.Set(forwardSentHeader, strconv.FormatInt(req.SentMs, 10))
	hr.Header.Set(ForwardSignatureHeader, hex.EncodeToString(forwardMAC(key, req)))
	return hr, nil
}

// seenSignatures remembers the signatures of the forwarded turns received
// within twice forwardMaxAge, so that a request captured on the way is not
// run a second time: a request older than forwardMaxAge is refused
// anyway, and a younger one is run once. At most maxSeenSignatures.
type seenSignatures struct {
	mu     sync.Mutex
	at     map[string]time.Time
	pruned time.Time
}

// maxSeenSignatures bounds seenSignatures: about 3,300 forwarded turns a
// second over its minute, 32 bytes and a time each.
const maxSeenSignatures = 200_000

var (
	errReplayed = errors.New("replayed")
	errTooMany  = errors.New("too many")
)

// add records sig received at now: errReplayed when it was already,
// errTooMany when there is no room left.
func (s *seenSignatures) add(sig string, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Pruned every quarter of forwardMaxAge, and when full at most once a
	// second: a full map is not scanned for every request.
	if since := now.Sub(s.pruned); since > forwardMaxAge/4 || len(s.at) >= maxSeenSignatures && since >= time.Second {
		for k, t := range s.at {
			if now.Sub(t) > 2*forwardMaxAge {
				delete(s.at, k)
			}
		}
		s.pruned = now
	}
	if _, ok := s.at[sig]; ok {
		return errReplayed
	}
	if len(s.at) >= maxSeenSignatures {
		return errTooMany
	}
	s.at[sig] = now
	return nil
}

// forwardMAC signs a forwarded turn: every field, each with its length.
func forwardMAC(key []byte, req *ForwardRequest) []byte {
	m := hmac.New(sha256.New, key)
	for _, f := range [][]byte{[]byte(req.Worker), []byte(req.Topic), []byte(req.Lock),
		[]byte(strconv.FormatInt(int64(req.Attempt), 10)), []byte(strconv.FormatInt(req.SentMs, 10)), req.Event} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		m.Write(n[:])
		m.Write(f)
	}
	return m.Sum(nil)
}

// ForwardHandler serves ForwardPath for d: a request signed under key
// (the cluster's peer key) runs as a turn of this node's worker.
func ForwardHandler(d *Dispatcher, key func(ctx context.Context) ([]byte, error)) http.Handler {
	seen := &seenSignatures{at: map[string]time.Time{}}
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		limit := int64(d.cfg.MaxEventBytes) + 2*MaxInputAttributeBytes + 4<<10 // the event, its attributes and the protobuf around them
		body, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, limit))
		if err != nil {
			http.Error(rw, "dispatch forward: "+err.Error(), http.StatusRequestEntityTooLarge)
			return
		}
		req := ForwardRequest{Worker: r.Header.Get(forwardWorkerHeader), Topic: r.Header.Get(forwardTopicHeader), Lock: r.Header.Get(forwardLockHeader), Event: body}
		attempt, aerr := strconv.ParseInt(r.Header.Get(forwardAttemptHeader), 10, 32)
		sent, serr := strconv.ParseInt(r.Header.Get(forwardSentHeader), 10, 64)
		switch {
		case aerr != nil || serr != nil:
			http.Error(rw, "dispatch forward: the attempt or sending time header is missing or not a number", http.StatusBadRequest)
			return
		case len(req.Worker) > maxForwardNameBytes || len(req.Topic) > maxForwardNameBytes || len(req.Lock) > maxForwardNameBytes:
			http.Error(rw, fmt.Sprintf("dispatch forward: a worker, topic or lock name over %d bytes", maxForwardNameBytes), http.StatusBadRequest)
			return
		}
		req.Attempt, req.SentMs = int32(attempt), sent
		k, err := key(r.Context())
		if err != nil {
			http.Error(rw, "dispatch forward: the peer key is unavailable", http.StatusServiceUnavailable)
			return
		}
		sig, err := hex.DecodeString(r.Header.Get(ForwardSignatureHeader))
		if err != nil || !hmac.Equal(sig, forwardMAC(k, &req)) {
			http.Error(rw, "dispatch forward: missing or wrong signature", http.StatusUnauthorized)
			return
		}
		if age := time.Since(time.UnixMilli(req.SentMs)); age > forwardMaxAge || age < -forwardMaxAge {
			http.Error(rw, fmt.Sprintf("dispatch forward: sent %s ago, outside ±%s", age.Round(time.Millisecond), forwardMaxAge), http.StatusBadRequest)
			return
		}
		switch seen.add(string(sig), time.Now()) {
		case errReplayed:
			http.Error(rw, "dispatch forward: this request was received before (a replay)", http.StatusConflict)
			return
		case errTooMany:
			// Not remembered, so not run: the sender takes the lock itself.
			rw.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(rw).Encode(&ForwardAnswer{Why: "too many forwarded turns in the last minute to remember"})
			return
		}
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(d.runForwarded(r.Context(), &req))
	})
}

// HTTPForwarder is a Forwarder over HTTP: addrs finds a node's advertised
// address (a node that advertises none is not sent turns), key the
// cluster's peer key.
func HTTPForwarder(client *http.Client, addrs *peeraddr.Cache, key func(ctx context.Context) ([]byte, error)) Forwarder {
	return &httpForwarder{client: client, addrs: addrs, key: key}
}

type httpForwarder struct {
	client *http.Client
	addrs  *peeraddr.Cache
	key    func(ctx context.Context) ([]byte, error)
}

func (f *httpForwarder) Forward(ctx context.Context, node string, req *ForwardRequest) (*ForwardAnswer, error) {
	addr := f.addrs.Addr(ctx, node)
	if addr == "" {
		return nil, fmt.Errorf("%w: no address for node %s", ErrNotForwarded, node)
	}
	k, err := f.key(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: peer key: %v", ErrNotForwarded, err)
	}
	hr, err := NewForwardRequest(ctx, "http://"+addr, k, req)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotForwarded, err)
	}
	resp, err := f.client.Do(hr)
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		f.addrs.Forget(node)
		return nil, fmt.Errorf("%w: %v", ErrNotForwarded, err) // nothing was sent
	}
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("%w: %s: %s", ErrNotForwarded, resp.Status, bytes.TrimSpace(b))
	}
	var ans ForwardAnswer
	if err := json.NewDecoder(io.LimitReader(resp.Body, 2*maxTraceback+4*maxErrorText+4<<10)).Decode(&ans); err != nil {
		return nil, err
	}
	return &ans, nil
}
