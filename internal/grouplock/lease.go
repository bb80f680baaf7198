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

// Lease is a held group lock. Token is its fencing token.
type Lease struct {
	Group  string
	Holder string
	Token  int64

	locks    *Locks
	slot     *slot
	acquired time.Time

	mu        sync.Mutex
	wrote     bool // wrote=true is recorded under this token
	stale     bool // a Check or a renewal found the lock taken by another token
	ending    bool // Release was called
	released  bool // the store no longer shows this lease held
	slotFreed bool
	// KeepAlive's goroutine, cancelled and waited for by Release.
	renewCancel context.CancelFunc
	renewDone   chan struct{}
}

// KeepAlive renews the lease (Renew) every Config.RenewEvery in the
// background until Release (which stops it and waits for it), ctx ends, or
// a renewal finds the lock taken: the lease is then stale and every later
// Check returns ErrStale, so nothing more is published or called under it.
// Call it once the lease is acquired, for work that may outlast MaxAge;
// later calls do nothing. A renewal that fails on a store error is tried
// again after RenewEvery/2; meanwhile the lock's age keeps growing in the
// store, so peers may take it after MaxAge as from a holder that stopped
// (and Check, which reads the store for an unwritten lease, then fails).
func (ls *Lease) KeepAlive(ctx context.Context) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.renewDone != nil || ls.ending || ls.stale {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	ls.renewCancel, ls.renewDone = cancel, done
	every := ls.locks.cfg.RenewEvery
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
			if err := ls.Renew(ctx); errors.Is(err, ErrStale) {
				return
			} else if err != nil {
				next = every / 2
			}
			t.Reset(next)
		}
	}()
}

// Renew extends the lease once: while the store still shows it (its token
// and holder, held) it records the current time as the lock's acquired
// time, with an ETag-guarded write, so peers count the lock's age from now.
// When the lock was taken meanwhile (or the lease released) it returns an
// error wrapping ErrStale, and the lease is stale from then on: every later
// Check fails. Store errors are returned wrapped and change nothing.
func (ls *Lease) Renew(ctx context.Context) error {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	switch {
	case ls.ending:
		return fmt.Errorf("grouplock %s token %d: released: %w", ls.Group, ls.Token, ErrStale)
	case ls.stale:
		return ls.staleErr()
	}
	now := time.UnixMilli(ls.locks.cfg.Now().UnixMilli())
	current, err := ls.update(ctx, func(rec *record) bool {
		rec.AcquiredMs = now.UnixMilli()
		return true
	})
	if err != nil {
		return err
	}
	if !current {
		ls.stale = true
		return ls.staleErr()
	}
	if now.After(ls.acquired) {
		ls.acquired = now
	}
	return nil
}

// stopRenewal ends KeepAlive's goroutine, if any, and waits for it.
func (ls *Lease) stopRenewal() {
	ls.mu.Lock()
	cancel, done := ls.renewCancel, ls.renewDone
	ls.renewCancel = nil
	ls.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// Check verifies, before each side effect made under the lease, that the
// lease is still the group's current lock, and returns an error wrapping
// ErrStale when it is not (stolen, or Released): the side effect must then
// not happen. The first successful Check records wrote=true under the token
// with an ETag write, which makes the lock unstealable until WrittenMaxAge;
// so later Checks of a lease younger than WrittenMaxAge return at once
// without a store round trip — unless Config.SelfAlive says peers may count
// this process as gone (and take its locks) —, and older ones only read.
// Once a Check (or a
// renewal, KeepAlive) found the lease stale, every later Check returns
// ErrStale too. Store errors are
// returned wrapped (the check did not pass).
func (ls *Lease) Check(ctx context.Context) error {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	l := ls.locks
	switch {
	case ls.ending:
		return fmt.Errorf("grouplock %s token %d: released: %w", ls.Group, ls.Token, ErrStale)
	case ls.stale:
		return ls.staleErr()
	case ls.wrote && l.cfg.Now().Sub(ls.acquired) < l.cfg.WrittenMaxAge && (l.cfg.SelfAlive == nil || l.cfg.SelfAlive()):
		return nil
	}
	asked := l.cfg.Now()
	current, err := ls.update(ctx, func(rec *record) bool {
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
		ls.stale = true
		return ls.staleErr()
	}
	// The answer says what the lock was when the store read or wrote it,
	// not now: a process paused with the answer unread (past its
	// membership, so that a peer took the lock meanwhile) must not act on
	// it. Not ErrStale: the lease may still be the group's.
	if l.cfg.AliveSince != nil && !l.cfg.AliveSince(asked) {
		return fmt.Errorf("grouplock %s token %d: this process's membership lapsed while the lock was being checked (a pause?): %w", ls.Group, ls.Token, ErrAnswerOutlived)
	}
	ls.wrote = true
	return nil
}

// Bounds of the retries of a lease's writes: updateTries writes per update
// when they conflict, pausing (full jitter) up to state.ConflictBackoffMax
// in between; releaseTries updates per Release when they fail, pausing
// RetryBase/4, RetryBase/2, ... (1.9 s in all at the default RetryBase).
const (
	updateTries  = 5
	releaseTries = 5
)

// update re-reads the lock and, while it still shows this lease, applies
// change and writes the record back guarded by its ETag, reading again after
// a conflict (e.g. a waiter marker written meanwhile); change returning false
// skips the write. It reports whether the lease was still current. Conflicts
// are tried updateTries times with short pauses: daprd's Redis state store
// reports every failed ETag-guarded write as an ETag mismatch, so a conflict
// that persists is the store failing, and returned as an error (wrapping
// state.ErrConflict).
func (ls *Lease) update(ctx context.Context, change func(*record) bool) (bool, error) {
	l := ls.locks
	key := Key(ls.Group)
	for try := 1; ; try++ {
		rec, etag, err := l.read(ctx, key)
		if err != nil {
			return false, err
		}
		if !ls.current(rec) {
			return false, nil
		}
		if !change(&rec) {
			return true, nil
		}
		err = l.put(ctx, key, rec, etag)
		if !errors.Is(err, state.ErrConflict) {
			return err == nil, err
		}
		if try == updateTries {
			return false, fmt.Errorf("grouplock %s token %d: %d writes conflicted (a failing store): %w", ls.Group, ls.Token, try, err)
		}
		pause := min(state.ConflictBackoffBase<<(try-1), state.ConflictBackoffMax)
		if err := l.cfg.Sleep(ctx, rand.N(pause)+1); err != nil {
			return false, err
		}
	}
}

// Release gives the lock up: it records held=false (keeping the token) if
// the store still shows this lease, and frees the group's local slot for the
// next caller of this process; KeepAlive's renewals stop first. A lease that was stolen leaves the new
// holder's lock alone and is not an error. ctx should not be one the caller
// has already cancelled (e.g. on shutdown), or the lock stays held in the
// store until it may be stolen. A failing write is tried releaseTries times,
// backing off (RetryBase/4, doubling): a lock left written blocks other
// nodes for WrittenMaxAge. After a store error the local slot is freed
// anyway and Release may be called again; later calls after success do
// nothing.
func (ls *Lease) Release(ctx context.Context) error {
	ls.mu.Lock()
	ls.ending = true // nothing more happens under it, no renewal either
	ls.mu.Unlock()
	ls.stopRenewal()
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.released {
		return nil
	}
	l := ls.locks
	defer func() {
		if !ls.slotFreed {
			ls.slotFreed = true
			l.unlockLocal(ls.Group, ls.slot)
		}
	}()
	if ls.stale {
		ls.released = true
		return nil
	}
	current, err := ls.update(ctx, func(rec *record) bool { rec.Held = false; return true })
	for try := 1; err != nil; try++ {
		if try == releaseTries {
			return err
		}
		// The lease mutex is not held while pausing (a Check returns
		// ErrStale at once, as the lease is ending).
		ls.mu.Unlock()
		serr := l.cfg.Sleep(ctx, backoff(max(l.cfg.RetryBase/4, time.Millisecond), try-1))
		ls.mu.Lock()
		if serr != nil {
			return err
		}
		if ls.released { // a concurrent Release succeeded meanwhile
			return nil
		}
		current, err = ls.update(ctx, func(rec *record) bool { rec.Held = false; return true })
	}
	ls.released = true
	if current {
		l.emit(Event{Kind: EventReleased, Group: ls.Group, Holder: ls.Holder, Token: ls.Token})
	}
	return nil
}

func (ls *Lease) current(rec record) bool {
	return rec.Held && rec.Token == ls.Token && rec.Holder == ls.Holder
}

func (ls *Lease) staleErr() error {
	return fmt.Errorf("grouplock %s token %d of %s: %w", ls.Group, ls.Token, ls.Holder, ErrStale)
}
