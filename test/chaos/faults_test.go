package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/virtufin/workmanager/internal/grouplock"
	"github.com/virtufin/workmanager/internal/infraevents"
	statestore "github.com/virtufin/workmanager/internal/state"
	"github.com/virtufin/workmanager/workflows"
)

// The faults of issue 43, each injected for real: a stale lifecycle
// activity attempt (sigstop-mid-lifecycle), a state store that refuses
// writes (store-write-outage) and a lock holder's lapsed membership
// (heartbeat-lapse).

// lapseMin and lapseMax bound a heartbeat lapse: past the membership TTL
// (3 heartbeats), the peers' next heartbeat (their view) and the stopped
// node's last beat before the stop, so that every peer counts the node
// gone; below the group lock's max age, so that a peer takes its lock
// because its holder is counted gone, not because the lock aged out.
const (
	lapseMin = 3*nodeHeartbeat + 3*nodeHeartbeat/2
	lapseMax = lockMaxAge - nodeHeartbeat/2
)

// lifecycleOpsLimit caps how long sigstop-mid-lifecycle keeps its node
// stopped while its create and delete are still unanswered (a delete
// whose Delete attempt went to the stopped node waits for its 1-minute
// start-to-close timeout); the calls go on after the node is woken.
const lifecycleOpsLimit = 100 * time.Second

// pauseDuringLifecycle is sigstop-mid-lifecycle. It creates a worker A
// (running on every node, n included), then SIGSTOPs node n (its whole
// process tree) with two lifecycle calls in flight: the deletion of A and
// the creation of a worker B. An activity of either (PrepareCode, Apply,
// Delete: any node's poll may be handed it) that went to n outlives its
// heartbeat (or start-to-close) timeout and is retried on another node;
// n's Activate is not picked up in time. n is woken once both calls
// answered and at least down passed: its stale attempts and its stale
// view (A attached) wake late. B is deleted a few seconds later. The
// checker's rules catch a resurrection: A's outputs after its deletion's
// bound, B's after its own, the API's list against the journal at
// convergence (divergence) and against the nodes' outputs
// (servedAfterConvergence). Half the time (by the fault's index) n is
// stopped first and the calls follow, else the calls start first and n
// is stopped 300 ms later (an activity of theirs may be running on it).
func (c *cluster) pauseDuringLifecycle(ctx context.Context, wl *workload, n *node, idx int, down time.Duration) (string, error) {
	topic := wl.topics[idx%len(wl.topics)]
	a, err := wl.create(opCtx(), fmt.Sprintf("tmplc%da", idx), topic, "", "python", false)
	if err != nil {
		return "", fmt.Errorf("creating the worker to delete under the pause: %w", err)
	}
	// A little traffic reaches A on every node before the pause.
	sleepCtx(ctx, 3*time.Second)
	var (
		wg            sync.WaitGroup
		delErr, crErr error
		b             *wrec
		delDur, crDur time.Duration
		thaw          func()
		stoppedAt     time.Time
		stopFirst     = idx%2 == 0
		notes         []string
	)
	if stopFirst {
		thaw, stoppedAt = c.freeze(n, false), time.Now()
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		began := time.Now()
		delErr = wl.remove(opCtx(), a)
		delDur = time.Since(began)
	}()
	go func() {
		defer wg.Done()
		began := time.Now()
		b, crErr = wl.create(opCtx(), fmt.Sprintf("tmplc%db", idx), topic, "", "python", false)
		crDur = time.Since(began)
	}()
	if !stopFirst {
		sleepCtx(ctx, 300*time.Millisecond)
		thaw, stoppedAt = c.freeze(n, false), time.Now()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	answered := false
	select {
	case <-done:
		answered = true
	case <-time.After(lifecycleOpsLimit):
	case <-ctx.Done():
	}
	sleepCtx(ctx, time.Until(stoppedAt.Add(down)))
	thaw()
	stoppedFor := time.Since(stoppedAt)
	if !answered {
		notes = append(notes, fmt.Sprintf("woken after %s with a call unanswered", lifecycleOpsLimit))
	}
	<-done // the calls end within opCtx's 4 minutes
	notes = append(notes, fmt.Sprintf("stopped %s (%s); delete %s: %s (%v), create: %s (%v)",
		stoppedFor.Round(100*time.Millisecond), map[bool]string{true: "stopped first", false: "calls first"}[stopFirst],
		idOf(a), delDur.Round(100*time.Millisecond), delErr, crDur.Round(100*time.Millisecond), crErr))
	hctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	notes = append(notes, fmt.Sprintf("%s's history: %s", a.name, timeouts(c.retriedAfterTimeout(hctx, a.id))))
	if b != nil {
		notes = append(notes, fmt.Sprintf("%s's: %s", b.name, timeouts(c.retriedAfterTimeout(hctx, b.id))))
	}
	cancel()
	if b != nil {
		// B runs a while (the woken node, whose view lacked it, attaches
		// it at its reconcile), then is deleted.
		sleepCtx(ctx, 8*time.Second)
		err := wl.remove(opCtx(), b)
		notes = append(notes, fmt.Sprintf("then deleted %s: %v", idOf(b), err))
	}
	return strings.Join(notes, "; "), nil
}

// stateWriteACL is the Redis ACL key rules of a state store that refuses
// writes: read-only on the state store's keys (statestore.KeyPrefix), read and
// write on every other key (the broker's streams). Redis's ACL globs
// cannot say "not this prefix", so the rules spell it out: every key
// whose first i bytes are the prefix's and whose next byte is not, for
// each i, and every proper prefix of the prefix itself.
func stateWriteACL(prefix string) []string {
	esc := func(s string) string {
		var b strings.Builder
		for _, r := range s {
			if strings.ContainsRune(`*?[]\^`, r) {
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
		return b.String()
	}
	rules := []string{"resetkeys"}
	for i := 0; i < len(prefix); i++ {
		rules = append(rules, "~"+esc(prefix[:i])+"[^"+esc(prefix[i:i+1])+"]*")
		if i > 0 {
			rules = append(rules, "~"+esc(prefix[:i]))
		}
	}
	return append(rules, "%R~"+esc(prefix)+"*")
}

// storeWriteOutage is store-write-outage: for down, the state store's
// Redis refuses writes to the state store's keys (NOPERM, by ACL) while
// reads of them, and the broker's streams on the same Redis, still work:
// membership heartbeats, group locks, delivery records, dead letters and
// catalog writes fail (Dapr's Redis state store reports a refused ETag
// write as an ETag mismatch: the node sees "concurrent modification").
// The fault checks its effect (a write refused, a read answered) and
// publishes a burst to a topic with a group (topic pick, modulo their
// number), so that grouped calls run during the outage. The no-loss,
// overlap and fencing rules must hold; dead letters it forces carry a
// fault reason.
func (c *cluster) storeWriteOutage(ctx context.Context, wl *workload, pick int, down time.Duration) (string, error) {
	r, err := dialRedis(c.stack.RedisAddr)
	if err != nil {
		return "", fmt.Errorf("connecting to Redis: %w", err)
	}
	defer r.close()
	args := append([]string{"ACL", "SETUSER", "default"}, stateWriteACL(statestore.KeyPrefix)...)
	if _, err := r.do(args...); err != nil {
		return "", fmt.Errorf("refusing state writes (ACL SETUSER): %w", err)
	}
	began := time.Now()
	restore := func() error {
		var err error
		for attempt := 0; attempt < 10; attempt++ {
			var rr *resp
			if rr, err = dialRedis(c.stack.RedisAddr); err == nil {
				_, err = rr.do("ACL", "SETUSER", "default", "resetkeys", "~*")
				rr.close()
				if err == nil {
					return nil
				}
			}
			time.Sleep(500 * time.Millisecond)
		}
		return fmt.Errorf("allowing state writes again (ACL SETUSER default resetkeys ~*): %w", err)
	}
	probe := statestore.KeyPrefix + "chaos-write-probe"
	var problems []error
	if _, err := r.do("HSET", probe, "data", "x"); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		problems = append(problems, fmt.Errorf("a state write was not refused during the outage: %v", err))
	}
	if _, err := r.do("HGET", probe, "data"); err != nil {
		problems = append(problems, fmt.Errorf("a state read failed during the outage: %w", err))
	}
	// A burst on a topic with a group, from the stack's own daprd (the
	// broker takes it: only the state store's keys are read-only).
	ti := pick % len(wl.topics)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 30 {
			id := fmt.Sprintf("t%d-%06d", ti+1, wl.seq.Add(1))
			wl.publish(ctx, wl.topics[ti], id, map[string]any{"n": id})
		}
	}()
	sleepCtx(ctx, time.Until(began.Add(down)))
	if err := restore(); err != nil {
		problems = append(problems, err)
	}
	wg.Wait()
	return fmt.Sprintf("state writes refused for %s, a burst of 30 on %s", time.Since(began).Round(100*time.Millisecond), wl.topics[ti]), errors.Join(problems...)
}

// lockRec is what heartbeat-lapse reads of a group lock's record.
type lockRec struct {
	Held   bool   `json:"held"`
	Holder string `json:"holder"`
	Node   string `json:"node"`
	Token  int64  `json:"token"`
}

// readLock reads the group lock record under key straight from Redis (the
// state store's hash, its data field); ok is false when there is none or
// it does not decode.
func readLock(r *resp, key string) (rec lockRec, ok bool) {
	v, err := r.do("HGET", key, "data")
	s, isStr := v.(string)
	if err != nil || !isStr {
		return rec, false
	}
	if json.Unmarshal([]byte(s), &rec) != nil {
		// Stored as a JSON string holding the JSON.
		var inner string
		if json.Unmarshal([]byte(s), &inner) != nil || json.Unmarshal([]byte(inner), &rec) != nil {
			return rec, false
		}
	}
	if rec.Node == "" {
		rec.Node, _, _ = strings.Cut(rec.Holder, "/")
	}
	return rec, true
}

// lockHolder returns a node that holds a group lock now (its record in
// the state store, read straight from Redis), the lock's key and token, or
// a nil node.
func (c *cluster) lockHolder(r *resp, keys []string) (*node, string, int64) {
	for _, k := range keys {
		rec, ok := readLock(r, k)
		if !ok || !rec.Held {
			continue
		}
		c.mu.Lock()
		for _, n := range c.nodes {
			if n.id == rec.Node && !n.down && !n.stopped {
				c.mu.Unlock()
				return n, k, rec.Token
			}
		}
		c.mu.Unlock()
	}
	return nil, "", 0
}

// heartbeatLapse is heartbeat-lapse: it waits (up to 15 s) for a node to
// hold a group lock, SIGSTOPs that node's process alone (its worker
// processes run on: a grouped call in flight finishes and its reply waits
// for the node) and checks that the lock is still its (else it wakes it at
// once and looks again), then keeps it stopped for down, past the
// membership TTL and below the lock's max age: the node's membership
// heartbeats lapse, its peers count it gone and may take its lock, and it
// comes back believing it holds the lock. The overlap and fencing rules
// catch a lock trusted twice. With no holder seen, it lapses fallback.
func (c *cluster) heartbeatLapse(ctx context.Context, fallback *node, down time.Duration) (*node, string, error) {
	r, err := dialRedis(c.stack.RedisAddr)
	if err != nil {
		return fallback, "", fmt.Errorf("connecting to Redis: %w", err)
	}
	defer r.close()
	var held *node
	var thaw func()
	deadline := time.Now().Add(15 * time.Second)
	var keys []string
	misses := 0
	for held == nil && time.Now().Before(deadline) && ctx.Err() == nil {
		if keys == nil {
			if v, err := r.do("KEYS", grouplock.Key("*")); err == nil {
				l, _ := v.([]any)
				for _, k := range l {
					if s, ok := k.(string); ok {
						keys = append(keys, s)
					}
				}
			}
			if len(keys) == 0 {
				keys = nil
				sleepCtx(ctx, 200*time.Millisecond)
				continue
			}
		}
		n, key, tok := c.lockHolder(r, keys)
		if n == nil {
			sleepCtx(ctx, 2*time.Millisecond)
			continue
		}
		// Stopped, it must still hold that lock (its call may have
		// released it meanwhile): else it is woken at once and the search
		// goes on.
		thaw = c.freeze(n, true)
		sleepCtx(ctx, 20*time.Millisecond) // a release already sent lands
		if rec, ok := readLock(r, key); ok && rec.Held && rec.Node == n.id && rec.Token == tok {
			held = n
			break
		}
		thaw()
		misses++
	}
	note := fmt.Sprintf("stopped holding a group lock (%d stops of a few ms first, released meanwhile)", misses)
	if held == nil {
		held, note = fallback, fmt.Sprintf("no lock holder seen in 15 s (%d stops of a few ms, released meanwhile)", misses)
		thaw = c.freeze(held, true)
	}
	stoppedAt := time.Now()
	sleepCtx(ctx, down)
	thaw()
	// The peers' takeovers of its locks, from the stop to a little after
	// the wake (their events reach the stream when published).
	sleepCtx(ctx, 3*time.Second)
	if n, err := c.lockTakeovers(held.id, stoppedAt, time.Now()); err != nil {
		note += fmt.Sprintf("; takeovers unknown: %v", err)
	} else {
		note += fmt.Sprintf("; its locks taken over by a peer %d times meanwhile", n)
	}
	return held, note, nil
}

// retriedAfterTimeout reads the workflow history of worker id (its current
// run) and counts, by activity type and timeout type, the activity
// attempts that timed out: an attempt retried after a timed-out one (its
// ActivityTaskStarted's attempt > 1 with a timeout as last failure; the
// timed-out attempts of a retried activity are not events of their own)
// and an activity that timed out for good (ActivityTaskTimedOut, e.g. a
// node's Activate not picked up). What sigstop-mid-lifecycle reports: a
// stale attempt happened, or the stopped node was handed none.
func (c *cluster) retriedAfterTimeout(ctx context.Context, id string) (map[string]int, error) {
	tc, err := client.DialContext(ctx, client.Options{HostPort: c.stack.TemporalAddr, Namespace: "default"})
	if err != nil {
		return nil, err
	}
	defer tc.Close()
	types := map[int64]string{}
	out := map[string]int{}
	it := tc.GetWorkflowHistory(ctx, workflows.WorkflowID(id), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			return out, err
		}
		if a := ev.GetActivityTaskScheduledEventAttributes(); a != nil {
			types[ev.GetEventId()] = a.GetActivityType().GetName()
		}
		if a := ev.GetActivityTaskStartedEventAttributes(); a != nil && a.GetAttempt() > 1 {
			if ti := a.GetLastFailure().GetTimeoutFailureInfo(); ti != nil {
				out[types[a.GetScheduledEventId()]+" retried after "+strings.ToLower(strings.TrimPrefix(ti.GetTimeoutType().String(), "TIMEOUT_TYPE_"))]++
			}
		}
		if a := ev.GetActivityTaskTimedOutEventAttributes(); a != nil {
			tt := "?"
			if ti := a.GetFailure().GetTimeoutFailureInfo(); ti != nil {
				tt = strings.ToLower(strings.TrimPrefix(ti.GetTimeoutType().String(), "TIMEOUT_TYPE_"))
			}
			out[types[a.GetScheduledEventId()]+" timed out "+tt]++
		}
	}
	return out, nil
}

// timeouts formats retriedAfterTimeout's counts.
func timeouts(m map[string]int, err error) string {
	if err != nil {
		return fmt.Sprintf("history unread: %v", err)
	}
	if len(m) == 0 {
		return "no activity timed out"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s ×%d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// lockTakeovers counts the group-lock acquisitions (the nodes'
// grouplock infra events, their Redis stream) between from and to whose
// previous holder was on node id and whose new holder is not: its peers
// took its lock while it lapsed.
func (c *cluster) lockTakeovers(id string, from, to time.Time) (int, error) {
	evs, err := readStream(c.stack.RedisAddr, infraevents.GroupLockTopic)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range evs {
		if e.at.Before(from) || e.at.After(to) {
			continue
		}
		d := e.data()
		kind, _ := d["kind"].(string)
		holder, _ := d["holder"].(string)
		prev, _ := d["prev_holder"].(string)
		if kind == grouplock.EventAcquired && strings.HasPrefix(prev, id+"/") && !strings.HasPrefix(holder, id+"/") {
			n++
		}
	}
	return n, nil
}
