// Package workerstats owns the counts of what each worker's messages did
// (attempts that succeeded, attempts that failed, messages dead-lettered,
// and the last failure), which GetWorker shows.
//
// Each node counts in memory, off the message path's state round trips
// (an atomic add per attempt), and a Recorder writes what changed every few
// seconds (Interval), each worker that changed once, concurrently through
// the node's batching store. A worker's counts are one key,
// workmanager/workerstats/<worker id>, holding one entry per node process
// that reported it: a node writes only its own entry, with an ETag
// compare-and-set (nodes writing one worker at once retry), and absolute
// values, so that a write repeated after an ambiguous failure counts
// nothing twice. A node that restarts (a new process, same node id)
// carries its old entry's counts over; a key keeps at most MaxNodes
// entries, the least recently written beyond that folded into one retired
// total (a node that left the cluster counts for ever, in one bounded key).
// Readers (the API) sum the entries: one read per worker, whatever the
// number of nodes.
//
// A node keeps the counter of every worker it attached for its life (a
// counter is this process's share of the worker's entry: dropping it at a
// detach would lose what it counted at the next write after a re-attach),
// about a hundred bytes plus the last error's text and event id.
//
// The counts are what the nodes saw, reported late by up to Interval (and
// lost for that last interval when a node dies without shutting down); the
// keys are not deleted with their workers (worker ids are never reused).
package workerstats

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

// Interval is how often a Recorder writes the counts that changed.
const Interval = 5 * time.Second

// MaxNodes bounds the node entries of one worker's key.
const MaxNodes = 32

// parallel is how many workers' keys a flush writes at once.
const parallel = 8

const keyPrefix = state.KeyPrefix + "workerstats/"

// Key is the state key of worker id's counts.
func Key(id string) string { return keyPrefix + id }

// Counts are message counts.
type Counts struct {
	Processed    int64 `json:"p,omitempty"`
	Failed       int64 `json:"f,omitempty"`
	DeadLettered int64 `json:"d,omitempty"`
}

func (c Counts) add(o Counts) Counts {
	return Counts{c.Processed + o.Processed, c.Failed + o.Failed, c.DeadLettered + o.DeadLettered}
}

func (c Counts) sub(o Counts) Counts {
	return Counts{c.Processed - o.Processed, c.Failed - o.Failed, c.DeadLettered - o.DeadLettered}
}

// LastError is a worker's last failed attempt.
type LastError struct {
	// Text is the error, bounded and redacted by the hot path.
	Text string `json:"e,omitempty"`
	// AtMS is when it happened (unix ms; 0: no failure yet).
	AtMS int64 `json:"t,omitempty"`
	// EventID is the CloudEvent id of the message.
	EventID string `json:"i,omitempty"`
}

func newer(a, b LastError) LastError {
	if b.AtMS > a.AtMS {
		return b
	}
	return a
}

// Totals are a worker's counts summed over the nodes.
type Totals struct {
	Counts
	Last LastError
}

// entry is one node process's share of a worker's counts.
type entry struct {
	// Epoch names the process that wrote it (random per process).
	Epoch string `json:"epoch"`
	// Counts is the node's total: earlier processes' and this one's.
	Counts Counts `json:"counts"`
	// Mine is the part of Counts this process counted (as of the write).
	Mine      Counts    `json:"mine"`
	Last      LastError `json:"last"`
	UpdatedMS int64     `json:"u"`
}

// record is the value of a worker's key.
type record struct {
	Nodes map[string]entry `json:"nodes,omitempty"`
	// Retired sums the entries folded away beyond MaxNodes.
	Retired     Counts    `json:"retired"`
	RetiredLast LastError `json:"retired_last"`
}

func (r record) totals() Totals {
	t := Totals{Counts: r.Retired, Last: r.RetiredLast}
	for _, e := range r.Nodes {
		t.Counts = t.Counts.add(e.Counts)
		t.Last = newer(t.Last, e.Last)
	}
	return t
}

// Read returns worker id's totals; false when no node has reported it yet.
func Read(ctx context.Context, st state.Store, id string) (Totals, bool, error) {
	it, err := st.Get(ctx, Key(id))
	if errors.Is(err, state.ErrNotFound) {
		return Totals{}, false, nil
	}
	if err != nil {
		return Totals{}, false, fmt.Errorf("worker stats of %s: %w", id, err)
	}
	var r record
	if err := json.Unmarshal(it.Value, &r); err != nil {
		return Totals{}, false, fmt.Errorf("worker stats of %s: decode: %w", id, err)
	}
	return r.totals(), true, nil
}

// ReadMany is Read for several workers, in one round trip on a
// state.Bulk store; a worker no node has reported is absent from the map.
func ReadMany(ctx context.Context, st state.Store, ids []string) (map[string]Totals, error) {
	out := make(map[string]Totals, len(ids))
	bulk, ok := st.(state.Bulk)
	if !ok {
		for _, id := range ids {
			t, found, err := Read(ctx, st, id)
			if err != nil {
				return nil, err
			}
			if found {
				out[id] = t
			}
		}
		return out, nil
	}
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = Key(id)
	}
	res, err := bulk.GetMany(ctx, keys)
	if err != nil {
		return nil, fmt.Errorf("worker stats: %w", err)
	}
	for i, r := range res {
		if errors.Is(r.Err, state.ErrNotFound) || (r.Err == nil && len(r.Value) == 0) {
			continue
		}
		if r.Err != nil {
			return nil, fmt.Errorf("worker stats of %s: %w", ids[i], r.Err)
		}
		var rec record
		if err := json.Unmarshal(r.Value, &rec); err != nil {
			return nil, fmt.Errorf("worker stats of %s: decode: %w", ids[i], err)
		}
		out[ids[i]] = rec.totals()
	}
	return out, nil
}

// Counter counts one worker's messages on this node. A nil *Counter counts
// nothing.
type Counter struct {
	processed, failed, dead atomic.Int64
	dirty                   atomic.Bool
	mu                      sync.Mutex
	last                    LastError

	// Owned by the flushing goroutine: what the last write that succeeded
	// stored as this process's counts (see entry.Mine); wrote: there was
	// one.
	written Counts
	wrote   bool
}

// Processed counts an attempt that succeeded.
func (c *Counter) Processed() {
	if c == nil {
		return
	}
	c.processed.Add(1)
	c.dirty.Store(true)
}

// Failed counts a failed attempt: its error text (bounded and redacted
// by the caller), time and CloudEvent id.
func (c *Counter) Failed(text, eventID string, at time.Time) {
	if c == nil {
		return
	}
	c.failed.Add(1)
	c.mu.Lock()
	if ms := at.UnixMilli(); ms >= c.last.AtMS {
		c.last = LastError{Text: text, AtMS: ms, EventID: eventID}
	}
	c.mu.Unlock()
	c.dirty.Store(true)
}

// DeadLettered counts a message given up on, with its error as the last
// one (bounded and redacted by the caller; "" keeps the last error).
func (c *Counter) DeadLettered(text, eventID string, at time.Time) {
	if c == nil {
		return
	}
	c.dead.Add(1)
	if text != "" {
		// The last error also when no attempt failed (a dead letter
		// without a run: crashed, not_runnable, too_large).
		c.mu.Lock()
		if ms := at.UnixMilli(); ms >= c.last.AtMS {
			c.last = LastError{Text: text, AtMS: ms, EventID: eventID}
		}
		c.mu.Unlock()
	}
	c.dirty.Store(true)
}

func (c *Counter) snapshot() (Counts, LastError) {
	c.mu.Lock()
	last := c.last
	c.mu.Unlock()
	return Counts{c.processed.Load(), c.failed.Load(), c.dead.Load()}, last
}

// Recorder holds a node's counters and writes them (Run). A nil
// *Recorder counts nothing.
type Recorder struct {
	st    state.Store
	node  string
	epoch string
	log   *slog.Logger
	now   func() time.Time

	mu       sync.Mutex
	counters map[string]*Counter
	flushing sync.Mutex
}

// NewRecorder writes node's counts to st (the node's batching store, so
// that a flush's concurrent reads and writes share round trips).
func NewRecorder(st state.Store, node string, log *slog.Logger) *Recorder {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &Recorder{st: st, node: node, epoch: hex.EncodeToString(b[:]), log: log, now: time.Now, counters: map[string]*Counter{}}
}

// Worker returns worker id's counter, the same one on every call.
func (r *Recorder) Worker(id string) *Counter {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.counters[id]
	if c == nil {
		c = &Counter{}
		r.counters[id] = c
	}
	return c
}

// Run writes the counts that changed every Interval until ctx ends, then
// once more (bounded by 5 s) so that a node shutting down reports its last
// interval.
func (r *Recorder) Run(ctx context.Context, interval time.Duration) {
	if r == nil {
		return
	}
	if interval <= 0 {
		interval = Interval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			if err := r.Flush(fctx); err != nil {
				r.log.Warn("worker stats not written at shutdown; the last interval's counts are lost", "err", err)
			}
			cancel()
			return
		case <-t.C:
			if err := r.Flush(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("worker stats not written; tried again at the next interval", "err", err)
			}
		}
	}
}

// Flush writes the counts of every worker that changed since its last
// write; a worker whose write failed is written again by the next Flush.
func (r *Recorder) Flush(ctx context.Context) error {
	if r == nil {
		return nil
	}
	r.flushing.Lock()
	defer r.flushing.Unlock()
	type job struct {
		id string
		c  *Counter
	}
	r.mu.Lock()
	var jobs []job
	for id, c := range r.counters {
		if c.dirty.Swap(false) {
			jobs = append(jobs, job{id, c})
		}
	}
	r.mu.Unlock()
	if len(jobs) == 0 {
		return nil
	}
	ch := make(chan job)
	var (
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
		fails int
	)
	for range min(parallel, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range ch {
				if err := r.write(ctx, j.id, j.c); err != nil {
					j.c.dirty.Store(true)
					errMu.Lock()
					fails++
					if first == nil {
						first = err
					}
					errMu.Unlock()
				}
			}
		}()
	}
	for _, j := range jobs {
		ch <- j
	}
	close(ch)
	wg.Wait()
	if first != nil {
		return fmt.Errorf("%d of %d workers' stats not written: %w", fails, len(jobs), first)
	}
	return nil
}

// write stores c's counts as this node's entry of worker id's key.
func (r *Recorder) write(ctx context.Context, id string, c *Counter) error {
	mine, last := c.snapshot()
	key := Key(id)
	for conflicts := 0; ; conflicts++ {
		if err := state.ConflictBackoff(ctx, conflicts); err != nil {
			return err
		}
		rec, etag, err := state.GetJSON[record](ctx, r.st, key)
		if err != nil {
			return fmt.Errorf("worker stats of %s: %w", id, err)
		}
		if rec.Nodes == nil {
			rec.Nodes = map[string]entry{}
		}
		e, ok := rec.Nodes[r.node]
		switch {
		case ok && e.Epoch == r.epoch:
			// This process's entry: replace its share.
			e.Counts = e.Counts.sub(e.Mine).add(mine)
		case ok:
			// An earlier process of this node: its counts are kept.
			e.Counts = e.Counts.add(mine)
		case c.wrote:
			// Folded into the retired total (MaxNodes) since the last
			// write, with what that write stored.
			e.Counts = mine.sub(c.written)
		default:
			e.Counts = mine
		}
		e.Epoch, e.Mine, e.Last, e.UpdatedMS = r.epoch, mine, newer(e.Last, last), r.now().UnixMilli()
		rec.Nodes[r.node] = e
		retire(&rec)
		b, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		err = r.st.Put(ctx, key, b, state.PutOptions{ETag: etag, IfAbsent: etag == ""})
		if errors.Is(err, state.ErrConflict) {
			continue
		}
		if err != nil {
			return fmt.Errorf("worker stats of %s: %w", id, err)
		}
		c.written, c.wrote = mine, true
		return nil
	}
}

// retire folds the least recently written entries into the retired total
// until at most MaxNodes are left.
func retire(rec *record) {
	for len(rec.Nodes) > MaxNodes {
		oldest := ""
		for n, e := range rec.Nodes {
			if oldest == "" || e.UpdatedMS < rec.Nodes[oldest].UpdatedMS || (e.UpdatedMS == rec.Nodes[oldest].UpdatedMS && n < oldest) {
				oldest = n
			}
		}
		e := rec.Nodes[oldest]
		rec.Retired = rec.Retired.add(e.Counts)
		rec.RetiredLast = newer(rec.RetiredLast, e.Last)
		delete(rec.Nodes, oldest)
	}
}
