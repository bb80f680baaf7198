package grouplock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

// Lease is one caller's turn under a group lock: one execution. Token is
// its fencing token, never handed out twice for the group and larger than
// every token of the group handed out before it anywhere.
//
// A lease stands on a hold: this process's acquisition of the group's lock
// in the store. Without Config.KeepFor every lease has a hold of its own
// (acquired by Acquire, released by Release). With it, a Release that finds
// another caller of this process waiting for the group keeps the hold, and
// that caller's Acquire takes the next token of the hold without a store
// round trip (see Config.KeepFor).
type Lease struct {
	Group  string
	Holder string
	Token  int64

	locks *Locks
	slot  *slot
	h     *hold

	mu        sync.Mutex
	ended     bool // Release was called: nothing more happens under it
	done      bool // the hold was kept for the next caller or released
	counted   bool // its token left the hold's live list
	yielded   bool // Yield passed the hold on: its release is not this lease's
	slotFreed bool
}

// hold is this process's acquisition of a group's lock: the record it
// wrote (holder, and top, its token: the highest token it reserved) and
// the tokens still to hand out (next..top). Its state is what the store
// said last: wrote, stale.
type hold struct {
	locks  *Locks
	group  string
	holder string // the record's holder: the first lease's

	mu       sync.Mutex
	top      int64 // the record's token
	next     int64 // the next lease's token (at most top)
	uses     int   // leases handed out
	acquired time.Time
	fairRead time.Time // when the record was last read for waiters
	wrote    bool      // wrote=true is recorded under this token
	stale    bool      // a Check or a renewal found the lock taken
	ending   bool      // being released
	released bool      // the store no longer shows it held
	// live are the tokens of its leases not yet released, ascending;
	// changed is closed (and replaced) whenever one is released.
	live    []int64
	changed chan struct{}
	// KeepAlive's goroutine, cancelled and waited for by release.
	renewCancel context.CancelFunc
	renewDone   chan struct{}
	// local is what the hold's users keep with it (Lease.Local).
	local any
	// yieldTo is the process whose fresh waiter marker ended the hold
	// (fairLocked) or showed in the record its release wrote
	// (noteWaiter), told once the lock is released (Config.Tell).
	yieldTo string
	// etag is the record's ETag after this hold's last write and rec what
	// that write wrote, when the store's ETags are versions
	// (Locks.nextETag): a write conditioned on it succeeds only while
	// nobody else wrote the record since, so update writes without
	// reading first (known). "": unknown.
	etag   string
	rec    record
	etagAt time.Time // when the write that etag follows was sent
}

// lease hands out the hold's next token to holder, reserving another block
// of tokens in the store when the reserved ones are used up (1 Get + 1
// Put). It returns nil when the hold cannot serve (stale, released, or the
// reservation failed: err).
func (h *hold) lease(ctx context.Context, holder string) (*Lease, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stale || h.ending || h.released {
		return nil, nil
	}
	if h.aged() {
		return nil, errAged
	}
	if h.next > h.top {
		block := h.locks.cfg.TokenBlock
		current, err := h.update(ctx, func(rec *record) bool {
			rec.Token += block
			return true
		})
		if err != nil {
			return nil, err
		}
		if !current {
			h.stale = true
			return nil, nil
		}
		h.top += block
	}
	ls := &Lease{Group: h.group, Holder: holder, Token: h.next, locks: h.locks, h: h}
	h.next++
	h.uses++
	h.live = append(h.live, ls.Token)
	return ls, nil
}

// errAged is hold.lease's answer for a hold too old to serve (aged).
var errAged = errors.New("grouplock: the hold is older than half of MaxAge")

// aged reports whether h was taken (or last renewed) half of MaxAge ago or
// more. Such a hold serves no more leases, kept or lingering: leases of a
// kept hold start without a store round trip, and an unwritten lock older
// than MaxAge may be taken by a peer (Locks.try), so a hold reused at a
// steady pace past that age — a long GROUP_LOCK_LINGER, a large KeepFor,
// calls too short for KeepAlive's renewals — would run its calls while
// another node ran the group's. It is given up, and the next caller
// acquires anew. The caller holds h.mu.
func (h *hold) aged() bool {
	return h.locks.cfg.Now().Sub(h.acquired) >= h.locks.cfg.MaxAge/2
}

// end takes token off the hold's live list and wakes Turn and idle.
func (h *hold) end(token int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, t := range h.live {
		if t == token {
			h.live = append(h.live[:i], h.live[i+1:]...)
			break
		}
	}
	if h.changed != nil {
		close(h.changed)
		h.changed = nil
	}
}

// waitLive waits until done says yes about the live list (under h.mu), or
// ctx ends (its error), or stop is closed (ErrTurnStopped; nil: never).
func (h *hold) waitLive(ctx context.Context, stop <-chan struct{}, done func(live []int64) bool) error {
	for {
		h.mu.Lock()
		if done(h.live) {
			h.mu.Unlock()
			return nil
		}
		if h.changed == nil {
			h.changed = make(chan struct{})
		}
		ch := h.changed
		h.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-stop:
			return ErrTurnStopped
		}
	}
}

// idle waits until every lease of the hold is released (a yielded one
// may still be publishing), or ctx ends.
func (h *hold) idle(ctx context.Context) error {
	return h.waitLive(ctx, nil, func(live []int64) bool { return len(live) == 0 })
}

// Yield lets the next caller of this process waiting for the group start
// under this lease's hold now, while this lease goes on with its side
// effects (publishing the outputs of a call that returned): the group's
// calls still never overlap, and its side effects go out in token order
// when each lease waits for its Turn first. It yields only when Release
// would keep the hold for that caller (Config.KeepFor: a caller waits
// here, no other process waits, the hold is current); otherwise it does
// nothing and reports false. The hold is given up in the store only once
// every lease of it is released, so no side effect of a yielded lease
// lands after the lock is free. Check, Turn and Release work as before.
func (ls *Lease) Yield(ctx context.Context) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.ended || ls.yielded || ls.slot == nil || ls.slotFreed {
		return false
	}
	if !ls.locks.keep(ctx, ls.h, ls.slot) {
		return false
	}
	ls.yielded, ls.slotFreed = true, true
	ls.locks.unlockLocal(ls.Group, ls.slot)
	return true
}

// Turn waits until every earlier lease of the hold (a smaller token) is
// released, or ctx ends: side effects made after Turn go out in token
// order even when leases yielded (Yield). Without Yield it returns at
// once.
func (ls *Lease) Turn(ctx context.Context) error {
	return ls.TurnUnless(ctx, nil)
}

// ErrTurnStopped: TurnUnless's stop was closed before the turn came.
var ErrTurnStopped = errors.New("grouplock: the wait for the turn was stopped")

// TurnUnless is Turn that also ends, with ErrTurnStopped, once stop is
// closed (an earlier lease took this one's side effects over).
func (ls *Lease) TurnUnless(ctx context.Context, stop <-chan struct{}) error {
	return ls.h.waitLive(ctx, stop, func(live []int64) bool { return len(live) == 0 || live[0] >= ls.Token })
}

// Later returns the tokens of the hold's leases after this one that are
// not released yet, ascending: the calls that Yield let start after it,
// whose side effects go out after its own.
func (ls *Lease) Later() []int64 {
	h := ls.h
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []int64
	for _, t := range h.live {
		if t > ls.Token {
			out = append(out, t)
		}
	}
	return out
}

// Local returns the value the lease's hold keeps for its users, made by
// create on the first call: state shared by the leases of one hold (the
// dispatcher's queue of outputs waiting for their turn).
func (ls *Lease) Local(create func() any) any {
	h := ls.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.local == nil {
		h.local = create()
	}
	return h.local
}

// KeepAlive renews the lease's hold (Renew) every Config.RenewEvery in the
// background until the hold is released (Release stops it and waits for
// it), ctx ends, or a renewal finds the lock taken: the lease is then stale
// and every later Check returns ErrStale, so nothing more is published or
// called under it. Call it once the lease is acquired, for work that may
// outlast MaxAge; later calls (by this lease, or by later leases of a kept
// hold) do nothing. A renewal that fails on a store error is tried again
// after RenewEvery/2; meanwhile the lock's age keeps growing in the store,
// so peers may take it after MaxAge as from a holder that stopped (and
// Check, which reads the store for an unwritten lease, then fails).
func (ls *Lease) KeepAlive(ctx context.Context) {
	if ls.isEnded() {
		return
	}
	h := ls.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.renewDone != nil || h.ending || h.stale {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	h.renewCancel, h.renewDone = cancel, done
	every := h.locks.cfg.RenewEvery
	go func() {
		defer close(done)
		t := time.NewTimer(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			next := every
			if err := h.renew(ctx); errors.Is(err, ErrStale) {
				return
			} else if err != nil {
				next = every / 2
			}
			t.Reset(next)
		}
	}()
}

// Renew extends the lease once: while the store still shows its hold (its
// token and holder, held) it records the current time as the lock's
// acquired time, with an ETag-guarded write, so peers count the lock's age
// from now. When the lock was taken meanwhile (or the lease released) it
// returns an error wrapping ErrStale, and the lease is stale from then on:
// every later Check fails. Store errors are returned wrapped and change
// nothing.
func (ls *Lease) Renew(ctx context.Context) error {
	if ls.isEnded() {
		return fmt.Errorf("grouplock %s token %d: released: %w", ls.Group, ls.Token, ErrStale)
	}
	return ls.h.renew(ctx)
}

func (h *hold) renew(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.ending:
		return fmt.Errorf("grouplock %s token %d: released: %w", h.group, h.top, ErrStale)
	case h.stale:
		return h.staleErr()
	}
	now := time.UnixMilli(h.locks.cfg.Now().UnixMilli())
	current, err := h.update(ctx, func(rec *record) bool {
		rec.AcquiredMs = now.UnixMilli()
		return true
	})
	if err != nil {
		return err
	}
	if !current {
		h.stale = true
		return h.staleErr()
	}
	if now.After(h.acquired) {
		h.acquired = now
	}
	return nil
}

// stopRenewal ends KeepAlive's goroutine, if any, and waits for it.
func (h *hold) stopRenewal() {
	h.mu.Lock()
	cancel, done := h.renewCancel, h.renewDone
	h.renewCancel = nil
	h.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// Check verifies, before each side effect made under the lease, that the
// lease is still the group's current lock, and returns an error wrapping
// ErrStale when it is not (stolen, or Released): the side effect must then
// not happen. The first successful Check of a hold records wrote=true under
// its token with an ETag write, which makes the lock unstealable until
// WrittenMaxAge; so later Checks (of this lease, and of later leases of a
// kept hold) younger than WrittenMaxAge return at once without a store
// round trip — unless Config.SelfAlive says peers may count this process
// as gone (and take its locks) —, and older ones only read. Once a Check
// (or a renewal, KeepAlive) found the hold stale, every later Check
// returns ErrStale too. Store errors are returned wrapped (the check did
// not pass).
func (ls *Lease) Check(ctx context.Context) error {
	if ls.isEnded() {
		return fmt.Errorf("grouplock %s token %d: released: %w", ls.Group, ls.Token, ErrStale)
	}
	return ls.h.check(ctx, ls.Token)
}

func (h *hold) check(ctx context.Context, token int64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	l := h.locks
	switch {
	case h.ending:
		return fmt.Errorf("grouplock %s token %d: released: %w", h.group, token, ErrStale)
	case h.stale:
		return h.staleErr()
	case h.wrote && l.cfg.Now().Sub(h.acquired) < l.cfg.WrittenMaxAge && (l.cfg.SelfAlive == nil || l.cfg.SelfAlive()):
		return nil
	}
	asked := l.cfg.Now()
	current, err := h.update(ctx, func(rec *record) bool {
		if rec.Wrote {
			return false
		}
		rec.Wrote = true
		return true
	})
	if err != nil {
		return err
	}
	if !current {
		h.stale = true
		return h.staleErr()
	}
	// The answer says what the lock was when the store read or wrote it,
	// not now: a process paused with the answer unread (past its
	// membership, so that a peer took the lock meanwhile) must not act on
	// it. Not ErrStale: the lease may still be the group's.
	if l.cfg.AliveSince != nil && !l.cfg.AliveSince(asked) {
		return fmt.Errorf("grouplock %s token %d: this process's membership lapsed while the lock was being checked (a pause?): %w", h.group, token, ErrAnswerOutlived)
	}
	h.wrote = true
	return nil
}

// Bounds of the retries of a hold's writes: updateTries writes per update
// when they conflict, pausing (full jitter) up to state.ConflictBackoffMax
// in between; releaseTries updates per release when they fail, pausing
// RetryBase/4, RetryBase/2, ... (1.9 s in all at the default RetryBase).
const (
	updateTries  = 5
	releaseTries = 5
)

// update re-reads the lock and, while it still shows this hold, applies
// change and writes the record back guarded by its ETag, reading again
// after a conflict (e.g. a waiter marker written meanwhile); change
// returning false skips the write. It reports whether the hold was still
// current. Conflicts are tried updateTries times with short pauses:
// daprd's Redis state store reports every failed ETag-guarded write as an
// ETag mismatch, so a conflict that persists is the store failing, and
// returned as an error (wrapping state.ErrConflict). The caller holds h.mu.
func (h *hold) update(ctx context.Context, change func(*record) bool) (bool, error) {
	l := h.locks
	key := Key(h.group)
	if rec, etag, ok := h.known(); ok && change(&rec) {
		// The record as this hold last wrote it, unless somebody wrote
		// since (then the write conflicts): no read first. A change that
		// writes nothing reads, so that the store says whether the hold
		// is still current.
		at := l.cfg.Now()
		err := l.put(ctx, key, rec, etag)
		if err == nil {
			h.noteWrite(etag, rec, at)
			return true, nil
		}
		h.etag = "" // read, then write (a write that landed shows there)
	}
	for try := 1; ; try++ {
		rec, etag, err := l.read(ctx, key)
		if err != nil {
			return false, err
		}
		if !h.current(rec) {
			return false, nil
		}
		if !change(&rec) {
			return true, nil
		}
		at := l.cfg.Now()
		err = l.put(ctx, key, rec, etag)
		if err == nil {
			h.noteWrite(etag, rec, at)
			return true, nil
		}
		h.etag = ""
		if !errors.Is(err, state.ErrConflict) {
			return false, err
		}
		if try == updateTries {
			return false, fmt.Errorf("grouplock %s token %d: %d writes conflicted (a failing store): %w", h.group, h.top, try, err)
		}
		pause := min(state.ConflictBackoffBase<<(try-1), state.ConflictBackoffMax)
		if err := l.cfg.Sleep(ctx, rand.N(pause)+1); err != nil {
			return false, err
		}
	}
}

// Release ends the lease: nothing more happens under it. When another
// caller of this process waits for the group and Config.KeepFor allows
// (keep), the hold passes to it without a store round trip; otherwise the
// lock is given up: held=false is recorded (keeping the token) if the store
// still shows the hold, and KeepAlive's renewals stop first. Either way the
// group's local slot is freed for the next caller of this process. A lease
// that was stolen leaves the new holder's lock alone and is not an error.
// ctx should not be one the caller has already cancelled (e.g. on
// shutdown), or the lock stays held in the store until it may be stolen. A
// failing write is tried releaseTries times, backing off (RetryBase/4,
// doubling): a lock left written blocks other nodes for WrittenMaxAge.
// After a store error the local slot is freed anyway and Release may be
// called again; later calls after success do nothing.
func (ls *Lease) Release(ctx context.Context) error {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.ended = true
	if ls.done {
		return nil
	}
	l, h := ls.locks, ls.h
	if !ls.counted {
		ls.counted = true
		h.end(ls.Token)
	}
	if ls.yielded {
		// The hold went on to the next caller, whose Release (or the
		// slot's last user) gives it up.
		ls.done = true
		return nil
	}
	defer func() {
		if !ls.slotFreed {
			ls.slotFreed = true
			l.unlockLocal(ls.Group, ls.slot)
		}
	}()
	if ls.slot != nil && !ls.slotFreed && l.keep(ctx, h, ls.slot) {
		ls.done = true
		return nil
	}
	if ls.slot != nil && !ls.slotFreed && l.lingers(ctx, h) {
		l.linger(ls.Group, ls.slot, h)
		ls.done = true
		return nil
	}
	// Leases that yielded before this one may still be publishing: the
	// lock is free for others only after their side effects.
	if err := h.idle(ctx); err != nil {
		return err
	}
	if err := h.release(ctx, ls.Holder); err != nil {
		return err
	}
	ls.done = true
	l.tellFreed(h, "")
	return nil
}

// isEnded reports whether Release was called.
func (ls *Lease) isEnded() bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.ended
}

// beginEnding marks the hold as ending (nothing more happens under it, no
// renewal either), stops its renewals and returns with h.mu held.
func (h *hold) beginEnding() {
	h.mu.Lock()
	h.ending = true
	h.mu.Unlock()
	h.stopRenewal()
	h.mu.Lock()
}

// release gives the hold's lock up in the store (see Lease.Release);
// releaser names the caller in the event.
func (h *hold) release(ctx context.Context, releaser string) error {
	h.beginEnding()
	defer h.mu.Unlock()
	if h.released {
		return nil
	}
	l := h.locks
	if h.stale {
		h.released = true
		return nil
	}
	free := func(rec *record) bool {
		rec.Held = false
		h.noteWaiter(*rec)
		return true
	}
	current, err := h.update(ctx, free)
	for try := 1; err != nil; try++ {
		if try == releaseTries {
			return err
		}
		// The hold's mutex is not held while pausing (a Check returns
		// ErrStale at once, as the hold is ending).
		h.mu.Unlock()
		serr := l.cfg.Sleep(ctx, backoff(max(l.cfg.RetryBase/4, time.Millisecond), try-1))
		h.mu.Lock()
		if serr != nil {
			return err
		}
		if h.released { // a concurrent release succeeded meanwhile
			return nil
		}
		current, err = h.update(ctx, free)
	}
	h.released = true
	if current {
		l.emit(Event{Kind: EventReleased, Group: h.group, Holder: releaser, Token: h.next - 1})
	}
	return nil
}

// noteWaiter notes, in rec (the record a release writes), another
// process's fresh waiter marker as the process to tell that the lock is
// free (hold.yieldTo). The caller holds h.mu.
func (h *hold) noteWaiter(rec record) {
	l := h.locks
	if rec.Waiter != "" && rec.Waiter != l.cfg.Node && l.cfg.Now().Sub(time.UnixMilli(rec.WaiterMs)) < l.cfg.WaiterMaxAge {
		h.yieldTo = rec.Waiter
	}
}

// handOver gives the hold's lock to the asker to in one ETag-guarded
// write (Config.HandTo): the record names to.Holder on to.Node, held,
// wrote=true, under the next block of tokens above this hold's. When
// another process's fresh waiter marker shows in the record, the lock is
// released for it instead (nil, nil: the waiter that came first takes it,
// as without hand-over). A hold no longer current is left alone (nil,
// nil). On a store error nothing is known to be written: the caller
// releases as usual.
func (h *hold) handOver(ctx context.Context, to Asker) (*Handover, error) {
	h.beginEnding()
	defer h.mu.Unlock()
	if h.released || h.stale {
		h.released = true
		return nil, nil
	}
	l := h.locks
	var hv *Handover
	handTo := func(rec *record) bool {
		now := l.cfg.Now()
		hv = nil
		if rec.Waiter != "" && rec.Waiter != to.Node && now.Sub(time.UnixMilli(rec.WaiterMs)) < l.cfg.WaiterMaxAge {
			rec.Held = false // another node waits: its turn
			return true
		}
		from := rec.Token
		if keyed(h.group) {
			from = max(from, now.UnixMilli()*TimeTokens)
		}
		*rec = record{Token: from + l.cfg.TokenBlock, Holder: to.Holder, Held: true, AcquiredMs: now.UnixMilli(), Wrote: true, Node: to.Node}
		hv = &Handover{Token: rec.Token, First: from + 1, AcquiredMs: rec.AcquiredMs}
		return true
	}
	current, err := h.update(ctx, handTo) // without a read when it can (known)
	if err != nil {
		return nil, err
	}
	h.released = true
	if !current {
		return nil, nil
	}
	if hv != nil {
		hv.ETag = h.etag // the asker writes it next without reading
	}
	l.emit(Event{Kind: EventReleased, Group: h.group, Holder: h.holder, Token: h.next - 1})
	return hv, nil
}

// known returns the record as this hold last wrote it and the record's
// ETag after that write, when the store's ETags are versions
// (Locks.nextETag) and the record cannot have expired since: a keyed
// lock's key expires KeyTTL after its last write, and written again after
// that it counts its versions from 1, so its ETag is trusted only within
// KeyTTL/2 of the hold's write. The caller holds h.mu.
func (h *hold) known() (record, string, bool) {
	l := h.locks
	if h.etag == "" || keyed(h.group) && l.cfg.Now().Sub(h.etagAt) >= l.cfg.KeyTTL/2 {
		return record{}, "", false
	}
	return h.rec, h.etag, true
}

// noteWrite records the hold's write of rec conditioned on etag, sent at
// at, for known. The caller holds h.mu.
func (h *hold) noteWrite(etag string, rec record, at time.Time) {
	h.etag, h.rec, h.etagAt = h.locks.nextETag(h.group, etag), rec, at
}

func (h *hold) current(rec record) bool {
	return rec.Held && rec.Token == h.top && rec.Holder == h.holder
}

func (h *hold) staleErr() error {
	return fmt.Errorf("grouplock %s token %d of %s: %w", h.group, h.top, h.holder, ErrStale)
}

// lingers decides, as the last lease of h ends with nobody here waiting,
// whether h stays held for Config.Linger: the same conditions as keep's
// but a waiting caller.
func (l *Locks) lingers(ctx context.Context, h *hold) bool {
	if l.cfg.KeepFor <= 0 || l.cfg.Linger <= 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return l.fairLocked(ctx, h)
}

// fairLocked reports whether h may be kept: current as far as this
// process knows, fewer than KeepFor leases served, and no other process's
// fresh waiter marker in the record (read at most every FairEvery). The
// caller holds h.mu.
func (l *Locks) fairLocked(ctx context.Context, h *hold) bool {
	if h.stale || h.ending || h.released || h.uses >= l.cfg.KeepFor || h.aged() {
		return false
	}
	if h.yieldTo != "" {
		return false // another node's marker was seen: its turn
	}
	if l.cfg.Alone != nil && l.cfg.Alone() {
		return true // nobody else to wait (Config.Alone)
	}
	if now := l.cfg.Now(); now.Sub(h.fairRead) >= l.cfg.FairEvery {
		rec, _, err := l.read(ctx, Key(h.group))
		if err != nil || !h.current(rec) {
			return false // released normally, which reads again
		}
		me := l.cfg.Node
		if me == "" {
			me = h.holder
		}
		if rec.Waiter != "" && rec.Waiter != me && now.Sub(time.UnixMilli(rec.WaiterMs)) < l.cfg.WaiterMaxAge {
			// Another node waits: its turn, told once the lock is free
			// (Lease.Release). It will likely hold the group next
			// (HeldAt).
			h.yieldTo = rec.Waiter
			if l.cfg.Node != "" {
				l.mu.Lock()
				l.noteHeldAtLocked(h.group, rec.Waiter)
				l.mu.Unlock()
			}
			return false
		}
		h.fairRead = now
	}
	return true
}

// keep decides, as a lease of h ends, whether h stays held for the next
// caller of this process (Config.KeepFor): only while another caller of
// the group waits here (or is acquiring), the hold is current as far as
// this process knows, it served fewer than KeepFor leases, and no other
// process waits for the group — read from the record at most every
// Config.FairEvery (1 Get), so that a node waiting for the group gets it
// within about that long. Kept, it is parked on the slot for the next
// Acquire. The caller holds the slot.
func (l *Locks) keep(ctx context.Context, h *hold, s *slot) bool {
	if l.cfg.KeepFor <= 0 {
		return false
	}
	l.mu.Lock()
	waiting := s.refs > 1
	l.mu.Unlock()
	if !waiting {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !l.fairLocked(ctx, h) {
		return false
	}
	l.mu.Lock()
	s.hold = h
	l.mu.Unlock()
	return true
}
