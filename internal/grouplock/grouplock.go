// Package grouplock owns the cluster-wide group locks of the hot path: at
// most one worker of a group processes at a time anywhere in the cluster, and
// every acquisition hands out a fencing token that only ever increases for
// the group. A lock is one permanent, never deleted, ETag-guarded key per
// group in the state store (Dapr's lock API has no tokens); inside one
// process the contenders of a group queue on a local slot first, so only one
// of them polls the store.
//
// Store round trips: an uncontended Acquire is 1 Get + 1 Put; a contended
// try is 1 Get, plus 1 Put for the waiter marker when another try follows;
// the first Check of a lease is 1 Get + 1 Put (recording wrote=true), later
// Checks need none while the lease is younger than Config.WrittenMaxAge (then
// 1 Get each); Release is 1 Get + 1 Put; a lease kept alive (KeepAlive)
// costs 1 Get + 1 Put per renewal, one every Config.RenewEvery (MaxAge/3),
// so a call shorter than that costs none. Each ETag conflict with a
// concurrent writer that leaves the lease current (a waiter marker) costs
// one more Get + Put. A lingering hold handed to another process that
// asked for it (Config.HandTo) costs the giver 1 Get + 1 Put and the
// taker none, its first Check included. When the store's ETags are
// versions (state.Versioned: state.redis), a hold knows its record's ETag
// after its own writes, so each write of a hold (Check, renewal, release,
// hand-over, a new token block) leaves out its Get while nobody else
// wrote the record since (a write by anybody else makes it conflict, and
// the hold reads and writes as on other stores, where state.Store.Put
// does not return the new ETag).
//
// A lock's age runs from its acquisition or its holder's last renewal
// (acquired_ms): a holder that keeps its lease alive while its call runs
// keeps the lock however long the call takes, and a holder that cannot
// renew (paused, cut off from the store, dead) loses it after MaxAge as
// before.
//
// Ages (MaxAge, WrittenMaxAge, the waiter marker's) compare one node's clock
// with the acquired_ms/waiter_ms written by another, so node clocks are
// assumed to agree to well within RetryBase.
package grouplock

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/virtufin/workmanager/internal/state"
	"github.com/virtufin/workmanager/internal/tenant"
)

var (
	// ErrContended: Acquire gave up after 1+MaxRetries tries.
	ErrContended = errors.New("grouplock: group is locked")
	// ErrStale: the lease is no longer the group's current lock (stolen,
	// released or never recorded); its side effects must not happen.
	ErrStale = errors.New("grouplock: stale lease")
	// ErrAnswerOutlived: a Check's store answer arrived after this
	// process's membership lapsed (Config.AliveSince), so it may be out of
	// date; the Check did not pass, but the lease is not known to be stale.
	// Callers treat it like a store error: nothing happens under the lease
	// and the work is given back.
	ErrAnswerOutlived = errors.New("grouplock: lock check answer outlived a membership lapse")
)

// DefaultMaxAge is Config.MaxAge's default (GROUP_LOCK_MAX_AGE_MS).
const DefaultMaxAge = 60 * time.Second

// DefaultKeyTTL is Config.KeyTTL's default (GROUP_KEY_LOCK_TTL).
const DefaultKeyTTL = time.Hour

// TimeTokens is how many fencing tokens a keyed lock's clock floor grows
// by per millisecond: a keyed lock acquires above max(its last token,
// now in ms × TimeTokens), so that a key whose lock expired (KeyTTL) and
// comes back starts above every token it had — as long as it made fewer
// than KeyTTL × TimeTokens acquisitions' worth of tokens before, and node
// clocks agree to well within KeyTTL.
const TimeTokens = 1 << 10

// keySep separates a keyed lock's group name from its key (group names
// hold no "#").
const keySep = "#"

// KeyedName is the lock name of one key of a group (name: Name's): the
// executions of one key of a keyed group exclude each other, different
// keys run in parallel. A key of up to 64 characters of A-Z a-z 0-9 . _ -
// ~ (not starting with "~") is used as it is; any other is replaced by "~"
// and 40 hex digits of its SHA-256, so a key an event controls cannot
// make a state key long or odd.
func KeyedName(name, key string) string {
	return name + keySep + encodeKey(key)
}

func encodeKey(key string) string {
	plain := len(key) > 0 && len(key) <= 64 && key[0] != '~'
	for i := 0; plain && i < len(key); i++ {
		c := key[i]
		plain = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == '~'
	}
	if plain {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "~" + hex.EncodeToString(sum[:20])
}

// keyed reports whether name is a keyed lock's (KeyedName).
func keyed(name string) bool { return strings.Contains(name, keySep) }

// Event kinds.
const (
	EventAcquired     = "acquired"
	EventReleased     = "released"
	EventTheftAborted = "theft_aborted"
	EventContended    = "contended"
)

// Event reports what a lock operation did. Holder is always the caller of
// the operation (the acquirer, the releaser). Token is the lease's token for
// "acquired" and "released" and 0 otherwise. PrevHolder and PrevToken name
// the lock found in the store: the robbed holder for a theft ("acquired"
// with Stolen), the holder whose written lock was not stolen
// ("theft_aborted"), the holder last seen holding the lock when giving up
// ("contended"; empty when it was last seen free, e.g. kept for a waiter).
type Event struct {
	Kind string `json:"kind"`
	// Group is the lock's name (Name): "<tenant>/<group>" for a group of
	// any tenant but the default, whose groups keep their bare names;
	// Tenant is that tenant ("" for the default).
	Group  string `json:"group"`
	Tenant string `json:"tenant,omitempty"`
	// Key is the group key of a keyed lock (KeyedName): the key itself,
	// or "~" and a hash of it for a key that is long or has other
	// characters than A-Z a-z 0-9 . _ - ~; empty for a whole group's lock.
	Key    string `json:"key,omitempty"`
	Holder string `json:"holder"`
	Token  int64  `json:"token"`
	Stolen bool   `json:"stolen,omitempty"`
	// Handed: "acquired" from the previous holder's hand-over on this
	// process's request (Config.HandTo), with no store round trip here.
	Handed     bool      `json:"handed,omitempty"`
	PrevHolder string    `json:"prev_holder,omitempty"`
	PrevToken  int64     `json:"prev_token,omitempty"`
	At         time.Time `json:"at"`
}

// Config tunes the locks; zero values take the defaults.
type Config struct {
	// RetryBase is the first backoff sleep of Acquire (default 500ms); the
	// sleeps double: base, 2*base, 4*base, ...
	RetryBase time.Duration
	// MaxRetries is how many tries follow the first one (default 3 when
	// zero; negative means none).
	MaxRetries int
	// MaxAge is the age (since the lock was taken or last renewed) after
	// which a lock whose holder made no writes under its token may be
	// stolen (default DefaultMaxAge). A stolen-from holder that wrote keeps
	// its lock: the theft is aborted and counts as a failed try. A holder
	// whose call may run longer keeps its lease alive (Lease.KeepAlive).
	MaxAge time.Duration
	// RenewEvery is how often a lease kept alive is renewed (default
	// MaxAge/3, so that a renewal may fail once and be tried again before
	// the lock can be taken; at most MaxAge/2).
	RenewEvery time.Duration
	// WrittenMaxAge is the escape hatch for a dead holder that wrote: a
	// written lock older than this may be stolen too, so a group cannot be
	// stuck forever (default 10*MaxAge; never less than MaxAge). The age
	// counts from the last renewal too, so a holder that keeps its lease
	// alive keeps it; one still working by then without renewing may lose
	// its lock, and its Check then fails.
	WrittenMaxAge time.Duration
	// WaiterMaxAge is how long a waiter marker keeps a free lock for its
	// waiter (default: the longest backoff sleep, RetryBase<<(MaxRetries-1),
	// plus RetryBase, so that the marker outlives the waiter's sleep until
	// its next poll, yet expires before a non-waiter spends all its tries).
	WaiterMaxAge time.Duration
	// HolderAlive, when set, tells whether a holder's process is still
	// alive (cluster membership); a lock whose holder is gone may be taken
	// at once, written or not. Nil: every holder counts as alive.
	HolderAlive func(holder string) bool
	// ConfirmGone, when set, is asked before a lock whose holder
	// HolderAlive counts as gone is taken: HolderAlive may answer from this
	// process's last view of the membership, which lags a holder whose
	// heartbeats just came back, so ConfirmGone reads the membership again
	// (true: still gone). Its error ends Acquire like a store error.
	ConfirmGone func(ctx context.Context, holder string) (bool, error)
	// SelfAlive, when set, tells whether the other nodes surely count this
	// process as alive (its cluster membership is current, and not just
	// back after a lapse that peers may not have seen end yet). When it is
	// not, they may take its locks (HolderAlive), written or not: every
	// Check then reads the store instead of trusting the lease, so that a
	// holder whose lock may have been taken does not act under it. Nil:
	// always alive.
	SelfAlive func() bool
	// AliveSince, when set, tells whether the other nodes have counted this
	// process alive without a break since t (a member now, and no lapse of
	// its membership ended after t). A Check's store answer is trusted only
	// when the process was alive for the whole round trip: an answer that
	// sat unread while the process was paused past its membership (a peer
	// may have taken the lock meanwhile) fails the Check with a lock error.
	// Nil: always.
	AliveSince func(t time.Time) bool
	// Node names this process in waiter markers (default: the holder). Set
	// it when one process acquires for several holders, so that a marker
	// left by one of them lets the next one take the lock. It must be unique
	// to the process: a lock recorded as taken by this Node that no local
	// lease holds (its Release failed) is taken over at once.
	Node string
	// KeepFor, when positive, lets a hold serve up to this many leases in
	// a row: a Release that finds another caller of this process waiting
	// for the group (a worker's next message) keeps the lock in the store
	// and passes it on, so that a run of a group's messages on one node
	// costs one acquisition and one release instead of one each (the
	// first Check of the hold still writes wrote=true; later ones are
	// free, as for one long lease). It is given up as soon as nobody here
	// waits, after KeepFor leases, or when another process waits for the
	// group (its waiter marker, read every FairEvery). Zero: every lease
	// acquires and releases its own.
	KeepFor int
	// Linger, with KeepFor, keeps a hold that nobody here waits for for
	// this long after its last lease (default 0: given up at once), so
	// that the group's (or the key's) next message within it needs no
	// store round trip either: a group at a steady rate, or a keyed group
	// whose keys come back, holds its lock across the gaps. The hold is
	// given up when Linger passes without a caller, after KeepFor leases,
	// or at the first release after another process's waiter marker shows
	// (read at most every FairEvery), so another node waits at most about
	// Linger more than without it.
	Linger time.Duration
	// FairEvery is how often a kept hold reads the record for another
	// process's waiter marker (default 100ms); a waiting node gets the
	// lock within about this long plus its own polling.
	FairEvery time.Duration
	// Alone, when set, reports whether no other process takes this
	// store's locks now (the node's last heartbeat saw no other live
	// node): a kept or lingering hold then skips FairEvery's read, as no
	// other process can have written a waiter marker — on a node alone, a
	// keyed group's holds made most of those reads. A process that joins
	// is seen at the next heartbeat; until then it waits for a busy run at
	// most KeepFor leases (it asks a lingering hold to be given up, as
	// always). Nil: never alone.
	Alone func() bool
	// Notify, when set, asks the process named node (a lock record's
	// Node) to give up its hold of group at once if it only lingers
	// there (Linger: nobody on that node uses it) — that process's
	// YieldIdle, for holder, the caller of Acquire asking — and returns
	// its answer. A process that finds the lock held by another calls it
	// after each try that wrote its waiter marker; when the answer hands
	// it the lock (Answer.Handed) the Acquire returns a lease of it with
	// no store round trip of its own, and when it only says released the
	// Acquire tries again at once, so that a group idle on one node passes
	// to another within a round trip or two instead of the rest of the
	// linger and FairEvery's polling. A hold in use is not given up early:
	// the fairness rules above apply. It is bounded by NotifyTimeout.
	Notify func(ctx context.Context, node, group, holder string) Answer
	// HandTo, when set, lets YieldIdle give a lingering hold straight to
	// the process that asked for it: one ETag-guarded write records the
	// asker's holder as the lock's, under the next token block, with
	// wrote=true, and the answer tells the asker its tokens (Answer.Handed),
	// instead of a release the asker then follows with an acquisition and
	// its first Check (three writes and three reads in all, one here). It
	// says whether holder, of the process node, may be written as the
	// lock's holder: node must be a live member whose holders HolderAlive
	// counts by node, so that a lock handed to a process that never learns
	// of it (the answer lost, or a question that was not its) is freed by
	// that process when asked (YieldIdle) or taken over by its next
	// Acquire, and is not left to WrittenMaxAge. Nil: holds are released
	// for the asker, never handed.
	HandTo func(node, holder string) bool
	// Tell, when set, tells the process named node that this one just
	// gave group's lock up for that process's waiter marker (a kept or
	// lingering hold yields to a waiting node: fairness), so that its
	// waiting Acquire tries at once (that process's Freed) instead of at
	// its next look at the record, up to FairEvery later: with two nodes
	// taking turns on a busy group the lock sat free for half of that on
	// average at every turn. Called in the background after the release's
	// write, bounded by NotifyTimeout; a Tell that is lost costs only that
	// wait.
	Tell func(ctx context.Context, node, group string)
	// TokenBlock is how many fencing tokens one store write reserves
	// (default 1): an acquisition records the token of the previous one
	// plus TokenBlock, and its leases take the tokens in between one after
	// another, reserving the next block when they are used up. Any
	// process taking the lock next starts above the whole block, so
	// tokens only grow, whichever version acquires.
	TokenBlock int64
	// KeyTTL is how long a keyed lock (KeyedName) stays in the store after
	// its last write (default DefaultKeyTTL): the locks of idle keys
	// expire, so the store holds one lock per key active within KeyTTL.
	// A key's token starts again from the time (TimeTokens), so it still
	// only grows after its lock expired.
	KeyTTL time.Duration
	// OnEvent, when set, is called synchronously for each Event; keep it
	// cheap.
	OnEvent func(Event)
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Sleep waits d or until ctx ends, returning ctx.Err() then (default a
	// timer).
	Sleep func(ctx context.Context, d time.Duration) error
}

// Locks hands out the group locks of one process. It is safe for concurrent
// use.
type Locks struct {
	store state.Store
	cfg   Config

	mu    sync.Mutex
	slots map[string]*slot
	// giving holds, by group, the channel closed once this process's hold
	// of the group being given up in the background (drop, endLinger,
	// ReleaseIdle: after the side effects of its yielded leases) is
	// released in the store: until then an Acquire here must not take the
	// record over as its own (try), or its outputs could go out before
	// those of the yielded leases, out of token order.
	giving map[string]chan struct{}
	// handedTo holds, by group, the process this one last gave a
	// lingering hold of the group up to (YieldIdle's asker) and when: the
	// group's next Acquire here asks that process first (acquire), as it
	// may only linger with it by then. At most maxHandedTo groups.
	handedTo map[string]handOver
	// heldAt holds, by group, the process that likely holds the group now
	// because this one gave its hold up to it (YieldIdle's asker, or the
	// waiter whose marker ended this process's hold: fairLocked) and when,
	// refreshed by each turn that ran there (HeldAt, Forwarded). At most
	// maxHandedTo groups.
	heldAt map[string]handOver

	// looks holds, by group, this process's Acquire trying the store
	// (acquire; the group's local slot lets one at a time) and its wait
	// between two tries, which Freed cuts short. An entry lives while
	// that Acquire runs.
	looks map[string]*looker

	// localWait, when set (by tests), is called before Acquire blocks on
	// the local slot of a group.
	localWait func(group string)
}

// looker is an Acquire of one group trying the store (Locks.looks).
type looker struct {
	cancel context.CancelFunc // ends its wait between two tries (lookLater); nil: not waiting
	freed  bool               // Freed came while it was not waiting: its next wait is cut at once
}

// handOver is a hold given up to another process (Locks.handedTo).
type handOver struct {
	node string
	at   time.Time
}

// maxHandedTo bounds Locks.handedTo (a keyed group's keys are groups of
// their own): past it the map starts again empty.
const maxHandedTo = 4096

// slot serializes the contenders of one group inside this process; refs
// counts its holder and waiters so that an unused slot can be dropped.
// hold is the group's lock kept for the next caller (Config.KeepFor).
type slot struct {
	ch   chan struct{}
	refs int
	hold *hold
	// lingering: hold is parked by Linger, with a reference of its own
	// (refs) and a timer (linger) that gives it up; whoever takes hold
	// out of the slot drops that reference.
	lingering bool
	linger    *time.Timer
}

// record is the JSON value of a group's lock key.
type record struct {
	Token      int64  `json:"token"`
	Holder     string `json:"holder"`
	Held       bool   `json:"held"`
	AcquiredMs int64  `json:"acquired_ms"`
	Wrote      bool   `json:"wrote"`
	Waiter     string `json:"waiter"`
	WaiterMs   int64  `json:"waiter_ms"`
	// Node is the process (Config.Node) that acquired the lock; empty when
	// Config.Node was not set.
	Node string `json:"node,omitempty"`
}

// Key is the state key of a group's lock; name is the group's lock name
// (Name): "grouplock/<group>" for the default tenant's groups,
// "grouplock/<tenant>/<group>" for any other tenant's.
func Key(name string) string { return state.KeyPrefix + "grouplock/" + name }

// Name is the lock name of tenant's group: the group itself for the default
// tenant ("" or tenant.Default: the key a group had before tenants, which
// nodes of an older version still lock), "<tenant>/<group>" for any other.
// Two tenants' groups of one name are two locks with their own fencing
// tokens, events and metrics; a group name holds no "/", so the two shapes
// never meet.
func Name(tenantName, group string) string {
	if tenantName == "" || tenantName == tenant.Default {
		return group
	}
	return tenantName + "/" + group
}

// split is Name's inverse: the tenant ("" for the default) and group of a
// lock name.
func split(name string) (tenantName, group string) {
	if t, g, ok := strings.Cut(name, "/"); ok {
		return t, g
	}
	return "", name
}

// New returns the locks kept in st.
func New(st state.Store, cfg Config) *Locks {
	if cfg.RetryBase <= 0 {
		cfg.RetryBase = 500 * time.Millisecond
	}
	if cfg.MaxRetries == 0 {
		cfg.MaxRetries = 3
	} else if cfg.MaxRetries < 0 {
		cfg.MaxRetries = 0
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultMaxAge
	}
	if cfg.RenewEvery <= 0 {
		cfg.RenewEvery = cfg.MaxAge / 3
	}
	cfg.RenewEvery = max(min(cfg.RenewEvery, cfg.MaxAge/2), time.Millisecond)
	if cfg.WrittenMaxAge <= 0 {
		cfg.WrittenMaxAge = 10 * cfg.MaxAge
	}
	cfg.WrittenMaxAge = max(cfg.WrittenMaxAge, cfg.MaxAge)
	if cfg.WaiterMaxAge <= 0 {
		cfg.WaiterMaxAge = backoff(cfg.RetryBase, cfg.MaxRetries-1) + cfg.RetryBase
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.KeyTTL <= 0 {
		cfg.KeyTTL = DefaultKeyTTL
	}
	if cfg.FairEvery <= 0 {
		cfg.FairEvery = 100 * time.Millisecond
	}
	cfg.TokenBlock = max(cfg.TokenBlock, 1)
	if cfg.Sleep == nil {
		cfg.Sleep = sleep
	}
	return &Locks{store: st, cfg: cfg, slots: map[string]*slot{}}
}

// Acquire takes group's lock for holder (an opaque id, e.g.
// "<node>/<worker>"); group is the lock's name, tenant included (Name). It first waits, as long as ctx allows, for the other
// callers of this process holding or acquiring the same group, without
// polling the store and without spending tries. Then it tries the store up
// to 1+MaxRetries times, sleeping RetryBase, 2*RetryBase, ... in between,
// and returns an error wrapping ErrContended when every try failed. A try
// fails when the lock is held (and not stealable), when a stale lock's
// holder wrote (theft aborted), when a free lock is kept for a fresh waiter
// of another holder, or when another acquirer won the write. A failing store
// ends Acquire at once with its error wrapped; ctx ending ends it with
// ctx.Err(). Locks are not reentrant: a holder id found holding counts as
// another holder. The lease must be Released.
func (l *Locks) Acquire(ctx context.Context, group, holder string) (*Lease, error) {
	if group == "" || holder == "" {
		return nil, fmt.Errorf("grouplock: empty group %q or holder %q", group, holder)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s, err := l.lockLocal(ctx, group)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	kept, lingered := s.hold, s.lingering
	s.hold, s.lingering = nil, false
	if lingered {
		s.linger.Stop() // if it fired, endLinger finds the hold taken
	}
	l.mu.Unlock()
	if lingered {
		l.drop(group, s) // the linger's reference (this caller holds one)
	}
	if kept != nil {
		// Kept by the previous caller's Release: its next token, no
		// store round trip (unless a new block of tokens is due).
		lease, err := kept.lease(ctx, holder)
		if lease != nil {
			lease.slot = s
			return lease, nil
		}
		if err != nil {
			// It could not reserve tokens, or it is too old to serve
			// (hold.aged): given up once the side effects of its earlier
			// leases went out, and acquired anew.
			_ = kept.idle(ctx)
			_ = kept.release(context.WithoutCancel(ctx), holder)
		}
	}
	// A hold of ours given up in the background is released first: its
	// yielded leases' side effects go out before this lease's.
	if err := l.afterGivingUp(ctx, group); err != nil {
		l.unlockLocal(group, s)
		return nil, err
	}
	lease, err := l.acquire(ctx, group, holder)
	if err != nil {
		l.unlockLocal(group, s)
		return nil, err
	}
	lease.slot = s
	l.mu.Lock()
	delete(l.heldAt, group) // held here now
	l.mu.Unlock()
	return lease, nil
}

// Warm asks, in the background, for group's hold from the process this
// one handed it to within Linger (Locks.handedTo: the group likely only
// lingers there now) when nothing of the group is here (no hold, no
// caller holding or waiting for it, none being given up), so that an
// Acquire of the group that follows soon — after a store read of its own,
// say — finds the hold handed back and parked here (it waits on the local
// slot meanwhile) instead of asking then: the question and the other
// process's write overlap the caller's own round trip. It makes no store
// round trip of its own and writes no waiter marker: a group that is not
// handed back is left to the Acquire. It needs Config.KeepFor,
// Config.Linger and Config.Notify (else it does nothing); ctx bounds it.
func (l *Locks) Warm(ctx context.Context, group, holder string) {
	if l.cfg.KeepFor <= 0 || l.cfg.Linger <= 0 || l.cfg.Notify == nil || group == "" || holder == "" || ctx.Err() != nil {
		return
	}
	l.mu.Lock()
	_, handed := l.handedTo[group]
	if !handed || l.slots[group] != nil || l.giving[group] != nil {
		l.mu.Unlock()
		return
	}
	s := &slot{ch: make(chan struct{}, 1), refs: 1}
	s.ch <- struct{}{} // held by the warm-up until it parks its hold or gives up
	l.slots[group] = s
	l.mu.Unlock()
	go func() {
		lease := l.askBack(ctx, group, holder)
		if lease == nil {
			l.unlockLocal(group, s)
			return
		}
		lease.slot = s
		// Kept for a caller that waits on the slot by now, else lingering.
		_ = lease.Release(context.WithoutCancel(ctx))
	}()
}

// NotifyTimeout bounds one Config.Notify call: a node that is up answers
// in a few milliseconds, and one that is not (paused, cut off) must not
// hold up a waiter that may have to take the lock from it.
const NotifyTimeout = 200 * time.Millisecond

func (l *Locks) acquire(ctx context.Context, group, holder string) (*Lease, error) {
	lk := &looker{}
	l.mu.Lock()
	if l.looks == nil {
		l.looks = map[string]*looker{}
	}
	l.looks[group] = lk
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		if l.looks[group] == lk {
			delete(l.looks, group)
		}
		l.mu.Unlock()
	}()
	if lease := l.askBack(ctx, group, holder); lease != nil {
		return lease, nil
	}
	for try := 0; ; try++ {
		more := try < l.cfg.MaxRetries
		lease, seen, mark, err := l.try(ctx, group, holder, more)
		if err != nil || lease != nil {
			return lease, err
		}
		if !more {
			ev := Event{Kind: EventContended, Group: group, Holder: holder}
			if seen.Held {
				ev.PrevHolder, ev.PrevToken = seen.Holder, seen.Token
			}
			l.emit(ev)
			return nil, fmt.Errorf("grouplock %s: %d tries: %w", group, try+1, ErrContended)
		}
		if lease, released := l.ask(ctx, group, holder, seen); lease != nil {
			return lease, nil
		} else if released {
			continue // given up for us: try now
		}
		if mark != nil {
			if err := mark(ctx); err != nil {
				return nil, err
			}
		}
		if lease, err := l.wait(ctx, group, holder, backoff(l.cfg.RetryBase, try)); err != nil || lease != nil {
			return lease, err
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

// askBack asks for group, for holder, the process this one gave it up to
// on its request within Linger (handedBack), if any: that process has
// likely run its messages and lingers with it now. Asked before the first
// read, a hold it hands back costs the acquisition no store round trip at
// all (one it releases, the read and the waiter marker of a try that
// finds it held). It returns the lease of a hold handed back, else nil.
func (l *Locks) askBack(ctx context.Context, group, holder string) *Lease {
	node := l.handedBack(group)
	if node == "" {
		return nil
	}
	lease, _ := l.ask(ctx, group, holder, record{Held: true, Node: node})
	return lease
}

// handedBack returns (and forgets) the process this one gave group up to
// within the last Linger, if any (Locks.handedTo).
func (l *Locks) handedBack(group string) string {
	if l.cfg.Notify == nil {
		return ""
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.handedTo[group]
	if !ok {
		return ""
	}
	delete(l.handedTo, group)
	if l.cfg.Now().Sub(h.at) > l.cfg.Linger {
		return ""
	}
	return h.node
}

// HeldAt returns the process this one gave group's hold up to within the
// last Linger — at its question (YieldIdle) or for its waiter marker —,
// when nothing of the group is here (no hold, no caller holding or
// waiting for it, none being given up): that process likely holds the
// group now, so a caller may have it run its work there (dispatch's
// forwarded turns) instead of asking for the hold back. "" when there is
// none. Forwarded says how the process answered.
func (l *Locks) HeldAt(group string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.heldAt[group]
	if !ok || l.slots[group] != nil || l.giving[group] != nil {
		return ""
	}
	if l.cfg.Now().Sub(h.at) > l.cfg.Linger {
		delete(l.heldAt, group)
		return ""
	}
	return h.node
}

// Forwarded notes how node, named by HeldAt, answered work of group sent
// to it: ran (under its lock of the group: HeldAt names it for another
// Linger) or not (forgotten: the next caller acquires as usual).
func (l *Locks) Forwarded(group, node string, ran bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.heldAt[group]
	if !ok || h.node != node {
		return
	}
	if ran {
		l.heldAt[group] = handOver{node: node, at: l.cfg.Now()}
	} else {
		delete(l.heldAt, group)
	}
}

// noteHeldAtLocked records that group's hold was given up to node now
// (HeldAt). The caller holds l.mu.
func (l *Locks) noteHeldAtLocked(group, node string) {
	if l.heldAt == nil || len(l.heldAt) >= maxHandedTo {
		l.heldAt = map[string]handOver{}
	}
	l.heldAt[group] = handOver{node: node, at: l.cfg.Now()}
}

// askable reports whether ask would put a question about seen.
func (l *Locks) askable(seen record) bool {
	return l.cfg.Notify != nil && seen.Held && seen.Node != "" && seen.Node != l.cfg.Node
}

// ask asks the process holding group in seen to give it up, for holder,
// when it only lingers there (Config.Notify). It returns the lease of a
// hold handed to holder (Answer.Handed), else whether the hold was given
// up (released: the next try may take it).
func (l *Locks) ask(ctx context.Context, group, holder string, seen record) (lease *Lease, released bool) {
	if !l.askable(seen) || ctx.Err() != nil {
		return nil, false
	}
	asked := l.cfg.Now()
	nctx, cancel := context.WithTimeout(ctx, NotifyTimeout)
	ans := l.cfg.Notify(nctx, seen.Node, group, holder)
	cancel()
	if ans.Handed != nil {
		// Released to us in any case: when the hand-over cannot be used,
		// the next try finds the record naming this process and takes it
		// over (try).
		return l.takeHanded(group, holder, *ans.Handed, asked), true
	}
	return nil, ans.Released
}

// takeHanded makes the lease of a hold handed to holder by its last
// holder (Config.HandTo), asked for at asked: the record names holder,
// with wrote=true, the tokens hv.First to hv.Token reserved for it. Its
// age counts from asked (not later than the record's acquired_ms), and,
// as for a Check's answer, an answer that arrives after this process's
// membership lapsed is not used (nil: the next try reads the store).
func (l *Locks) takeHanded(group, holder string, hv Handover, asked time.Time) *Lease {
	if hv.First <= 0 || hv.First > hv.Token {
		return nil
	}
	if l.cfg.AliveSince != nil && !l.cfg.AliveSince(asked) {
		return nil
	}
	acquired := asked
	if at := time.UnixMilli(hv.AcquiredMs); at.Before(acquired) {
		acquired = at
	}
	h := &hold{locks: l, group: group, holder: holder, top: hv.Token, next: hv.First, acquired: acquired, fairRead: l.cfg.Now(), wrote: true}
	if hv.ETag != "" && l.nextETag(group, "") != "" {
		// What the giver wrote (handOver), under the ETag it says.
		h.etag, h.etagAt = hv.ETag, asked
		h.rec = record{Token: hv.Token, Holder: holder, Held: true, AcquiredMs: hv.AcquiredMs, Wrote: true, Node: l.cfg.Node}
	}
	lease := &Lease{Group: group, Holder: holder, Token: h.next, locks: l, h: h}
	h.next++
	h.uses++
	h.live = []int64{lease.Token}
	l.emit(Event{Kind: EventAcquired, Group: group, Holder: holder, Token: lease.Token, Handed: true})
	return lease
}

// wait sleeps d between two tries of Acquire. With KeepFor (holds that
// yield to a waiting node within about FairEvery) it looks at the record
// every FairEvery meanwhile (1 Get each) and ends early once the lock is
// free for this process, or its holder gave up a hold that had come to
// linger when asked (Config.Notify), so a hand-over between nodes takes
// about FairEvery instead of the rest of the backoff; the tries (and
// their events) stay those of the backoff. A look that finds the lock
// held with no fresh waiter marker writes this process's (1 Put), so the
// holder yields at its next fairness read even when the try wrote none.
func (l *Locks) wait(ctx context.Context, group, holder string, d time.Duration) (*Lease, error) {
	if l.cfg.KeepFor <= 0 || d <= l.cfg.FairEvery {
		return nil, l.cfg.Sleep(ctx, d)
	}
	me, key := l.cfg.Node, Key(group)
	for d > 0 {
		step := min(d, l.cfg.FairEvery)
		if err := l.lookLater(ctx, group, step); err != nil {
			return nil, err
		}
		d -= step
		if d <= 0 || me == "" {
			continue
		}
		rec, etag, err := l.read(ctx, key)
		if err != nil {
			continue // the next try says what the store says
		}
		now := l.cfg.Now()
		fresh := rec.Waiter != "" && now.Sub(time.UnixMilli(rec.WaiterMs)) < l.cfg.WaiterMaxAge
		if !rec.Held && (!fresh || rec.Waiter == me) || rec.Held && rec.Node == me {
			// Free for us, or recorded as ours (a hold handed to us
			// whose answer came too late): try now.
			return nil, nil
		}
		if lease, released := l.ask(ctx, group, holder, rec); lease != nil || released {
			return lease, nil // its holder's run ended and it only lingered: given up for us
		}
		if rec.Held && !fresh {
			// Held with nobody's marker: ours is missing — the try saw
			// the lock kept for another node's marker (that node took it
			// since, writing its record without one), or the try's
			// marker lost its write to a concurrent one. Without it the
			// holder keeps its hold for whole runs (KeepFor) and takes
			// it back after each, and this process waits for its next
			// try (RetryBase, doubling). A lost write is left to the
			// next look.
			mark := rec
			mark.Waiter, mark.WaiterMs = me, now.UnixMilli()
			if err := l.put(ctx, key, mark, etag); err != nil && !errors.Is(err, state.ErrConflict) {
				continue // the next try says what the store says
			}
		}
	}
	return nil, nil
}

// Freed is the other side of Config.Tell: the process that held group's
// lock gave it up for this process's waiter marker. The Acquires of the
// group waiting here between two tries look at the record at once (and
// try when it is free for them); nothing else changes, so a Freed that
// nobody sent costs one read per waiting Acquire.
func (l *Locks) Freed(group string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lk := l.looks[group]
	switch {
	case lk == nil:
		// Nobody here tries for it: nothing to do, nothing kept.
	case lk.cancel == nil:
		lk.freed = true // between two looks (reading, asking): the next wait is cut
	default:
		lk.cancel()
		lk.cancel = nil
	}
}

// lookLater sleeps d (Config.Sleep) unless Freed(group) comes first;
// only ctx's end is an error.
func (l *Locks) lookLater(ctx context.Context, group string, d time.Duration) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	l.mu.Lock()
	lk := l.looks[group] // set by acquire, which called this
	if lk != nil && lk.freed {
		lk.freed = false
		l.mu.Unlock()
		return ctx.Err()
	}
	if lk != nil {
		lk.cancel = cancel
	}
	l.mu.Unlock()
	_ = l.cfg.Sleep(sctx, d) // its error is ctx's (below) or Freed's cut
	if lk != nil {
		l.mu.Lock()
		lk.cancel = nil
		l.mu.Unlock()
	}
	return ctx.Err()
}

// tellFreed tells the process whose marker ended h (hold.yieldTo), if
// any and not except, that the lock is free (Config.Tell), in the
// background.
func (l *Locks) tellFreed(h *hold, except string) {
	h.mu.Lock()
	node := h.yieldTo
	h.mu.Unlock()
	if node == "" || node == except || l.cfg.Tell == nil || node == l.cfg.Node {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), NotifyTimeout)
		defer cancel()
		l.cfg.Tell(ctx, node, h.group)
	}()
}

// try makes one attempt on the store: it returns the lease when it took the
// lock, else what it saw (with a nil error for a failed try). more says
// whether another try follows (only then a waiter marker is worth writing).
func (l *Locks) try(ctx context.Context, group, holder string, more bool) (*Lease, record, func(context.Context) error, error) {
	key := Key(group)
	rec, etag, err := l.read(ctx, key)
	if err != nil {
		return nil, rec, nil, err
	}
	now := l.cfg.Now()
	age := now.Sub(time.UnixMilli(rec.AcquiredMs))
	var gone bool
	if rec.Held && (l.cfg.Node == "" || rec.Node != l.cfg.Node) && l.cfg.HolderAlive != nil && !l.cfg.HolderAlive(rec.Holder) {
		gone = true
		if l.cfg.ConfirmGone != nil {
			// This process's view may predate the holder's return.
			if gone, err = l.cfg.ConfirmGone(ctx, rec.Holder); err != nil {
				return nil, rec, nil, fmt.Errorf("grouplock: is %s gone: %w", rec.Holder, err)
			}
		}
	}
	var take bool
	switch {
	case !rec.Held:
		take = true
	case l.cfg.Node != "" && rec.Node == l.cfg.Node:
		// Taken by this process, whose holders of the group queue on the
		// local slot we now hold: no lease of ours is live, so this one
		// was ended by a Release that could not reach the store (e.g. an
		// outage). Without this the process would lock itself out of its
		// own group until WrittenMaxAge.
		take = true
	case gone:
		// Its holder's process is gone: nothing can still write under its
		// token, whatever it wrote before, so waiting for the max age (or
		// the written max age) would only stall the group.
		take = true
	case !rec.Wrote && age >= l.cfg.MaxAge:
		take = true
	case rec.Wrote && age >= l.cfg.WrittenMaxAge:
		take = true
	case rec.Wrote && age >= l.cfg.MaxAge:
		l.emit(Event{Kind: EventTheftAborted, Group: group, Holder: holder, PrevHolder: rec.Holder, PrevToken: rec.Token})
	}
	// The waiter is a process (Config.Node), not a holder: the local slot
	// serializes this process's holders, so whichever of them polls next
	// is the one the marker waits for.
	me := l.cfg.Node
	if me == "" {
		me = holder
	}
	waiterFresh := rec.Waiter != "" && now.Sub(time.UnixMilli(rec.WaiterMs)) < l.cfg.WaiterMaxAge
	if take && waiterFresh && rec.Waiter != me {
		// Kept for the node that has been waiting; it takes the lock on its
		// next poll. Our own unreleased lock is released for it first.
		if rec.Held && rec.Node == l.cfg.Node {
			freed := rec
			freed.Held = false
			if err := l.put(ctx, key, freed, etag); err != nil && !errors.Is(err, state.ErrConflict) {
				return nil, rec, nil, err
			} else if err == nil {
				l.emit(Event{Kind: EventReleased, Group: group, Holder: rec.Holder, Token: rec.Token})
			}
		}
		return nil, rec, nil, nil
	}
	if !take {
		if more && (!waiterFresh || rec.Waiter == me) {
			mark := func(ctx context.Context) error {
				mark := rec
				mark.Waiter, mark.WaiterMs = me, now.UnixMilli()
				if err := l.put(ctx, key, mark, etag); err != nil && !errors.Is(err, state.ErrConflict) {
					return err
				}
				return nil
			}
			if l.cfg.HandTo != nil && l.askable(rec) {
				// Its holder is asked first (acquire): a hold it hands
				// over needs no marker, and a marker written now would
				// make its hand-over's write conflict. Marked only when
				// the question does not get the lock.
				return nil, rec, mark, nil
			}
			if err := mark(ctx); err != nil {
				return nil, rec, nil, err
			}
		}
		return nil, rec, nil, nil
	}
	from := rec.Token
	if keyed(group) {
		// Its record may have expired (KeyTTL): start above the clock.
		from = max(from, now.UnixMilli()*TimeTokens)
	}
	next := record{Token: from + l.cfg.TokenBlock, Holder: holder, Held: true, AcquiredMs: now.UnixMilli(), Node: l.cfg.Node}
	err = l.put(ctx, key, next, etag)
	if errors.Is(err, state.ErrConflict) {
		return nil, rec, nil, nil // another acquirer (or a marker) came first
	}
	if err != nil {
		l.undo(ctx, key, next)
		return nil, rec, nil, err
	}
	h := &hold{locks: l, group: group, holder: holder, top: next.Token, next: from + 1, acquired: time.UnixMilli(next.AcquiredMs), fairRead: now,
		etag: l.nextETag(group, etag), rec: next, etagAt: now}
	lease := &Lease{Group: group, Holder: holder, Token: h.next, locks: l, h: h}
	h.next++
	h.uses++
	h.live = []int64{lease.Token}
	ev := Event{Kind: EventAcquired, Group: group, Holder: holder, Token: lease.Token}
	if rec.Held {
		ev.Stolen, ev.PrevHolder, ev.PrevToken = true, rec.Holder, rec.Token
	}
	l.emit(ev)
	return lease, rec, nil, nil
}

// undoTimeout bounds undo's store calls.
const undoTimeout = 5 * time.Second

// undo frees next, the lock this process tried to write, when the write
// returned an error but may have landed anyway (a stop cancelled Acquire
// during the call, a timeout): no lease holds it, and peers could take it
// only after MaxAge. Best effort, on a context that outlives ctx's
// cancellation; the token is kept, so it still only grows.
func (l *Locks) undo(ctx context.Context, key string, next record) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	rec, etag, err := l.read(ctx, key)
	if err != nil || !rec.Held || rec.Token != next.Token || rec.Holder != next.Holder || rec.AcquiredMs != next.AcquiredMs {
		return
	}
	rec.Held = false
	_ = l.put(ctx, key, rec, etag)
}

// read returns the group's record and ETag; an absent key is the zero record
// with an empty ETag.
func (l *Locks) read(ctx context.Context, key string) (record, string, error) {
	var rec record
	it, err := l.store.Get(ctx, key)
	if errors.Is(err, state.ErrNotFound) {
		return rec, "", nil
	}
	if err != nil {
		return rec, "", fmt.Errorf("grouplock: %w", err)
	}
	if err := json.Unmarshal(it.Value, &rec); err != nil {
		return rec, "", fmt.Errorf("grouplock: decode %s: %w", key, err)
	}
	return rec, it.ETag, nil
}

// put writes rec conditioned on etag, or as first write when the key was
// absent (etag empty). A conflict is returned wrapping state.ErrConflict.
func (l *Locks) put(ctx context.Context, key string, rec record, etag string) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	opts := state.PutOptions{ETag: etag, IfAbsent: etag == ""}
	if strings.Contains(key, keySep) {
		opts.TTL = l.cfg.KeyTTL // an idle key's lock expires
	}
	if err := l.store.Put(ctx, key, b, opts); err != nil {
		return fmt.Errorf("grouplock: %w", err)
	}
	return nil
}

// linger parks h on s for Config.Linger (see there); the caller holds
// the slot and frees it after.
func (l *Locks) linger(group string, s *slot, h *hold) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s.refs++
	s.hold, s.lingering = h, true
	s.linger = time.AfterFunc(l.cfg.Linger, func() { l.endLinger(group, s, h) })
}

// endLinger gives up h when it is still parked on s after Config.Linger.
func (l *Locks) endLinger(group string, s *slot, h *hold) {
	l.mu.Lock()
	if s.hold != h || !s.lingering {
		l.mu.Unlock()
		return // taken by a caller meanwhile
	}
	s.hold, s.lingering = nil, false
	given := l.givingUp(group)
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), undoTimeout)
	defer cancel()
	_, _ = l.giveUp(ctx, group, s, h, given, Asker{})
}

// giveUp releases h, taken off s (which it lingered on) with given from
// givingUp, once its yielded leases' side effects went out — or hands it
// to the asker to when Config.HandTo allows (to: zero for none).
func (l *Locks) giveUp(ctx context.Context, group string, s *slot, h *hold, given func(), to Asker) (*Handover, error) {
	defer l.drop(group, s)
	defer given()
	_ = h.idle(ctx)
	if to.Node != "" && to.Holder != "" && to.Node != l.cfg.Node && l.cfg.HandTo != nil && l.cfg.HandTo(to.Node, to.Holder) {
		if hv, err := h.handOver(ctx, to); hv != nil || err == nil {
			return hv, err
		}
	}
	if err := h.release(ctx, h.holder); err != nil {
		return nil, err
	}
	l.tellFreed(h, to.Node) // the asker has the answer
	return nil, nil
}

// Asker names who asks for a hold (YieldIdle): its process (Config.Node)
// and the holder its Acquire is for; either may be empty (unknown).
type Asker struct{ Node, Holder string }

// Answer is what a process asked to give up its hold of a group answers
// (YieldIdle, Config.Notify).
type Answer struct {
	// Released: the hold was given up (released, or handed to the asker).
	Released bool `json:"released"`
	// Handed, when set, is the lock handed to the asker (Config.HandTo).
	Handed *Handover `json:"handed,omitempty"`
}

// Handover is a group's lock its holder handed straight to the process
// that asked for it (Config.HandTo): the record it wrote names the
// asker's holder, with wrote=true.
type Handover struct {
	// Token is the record's token, the last of the block reserved for
	// the asker; First is its first lease's.
	Token int64 `json:"token"`
	First int64 `json:"first"`
	// AcquiredMs is the record's acquired_ms.
	AcquiredMs int64 `json:"acquired_ms"`
	// ETag, when the store's ETags are versions (state.Versioned), is the
	// record's after the hand-over: the asker's own hand-over of the lock
	// writes with it without reading the record first.
	ETag string `json:"etag,omitempty"`
}

// nextETag is the ETag of group's record after a write of it conditioned
// on etag ("": a create), when the store's ETags are versions
// (state.Versioned); "" otherwise. A record written this way is assumed
// to stay until it expires (a keyed lock's, KeyTTL: hold.known) — a key
// deleted and written again would count its versions from 1 again, as it
// would restart a group's tokens.
func (l *Locks) nextETag(group, etag string) string {
	v, ok := l.store.(state.Versioned)
	if !ok {
		return ""
	}
	next, ok := v.NextETag(etag)
	if !ok {
		return ""
	}
	return next
}

// YieldIdle is the other side of Config.Notify: it gives up this
// process's hold of group at once when the hold only lingers (Linger:
// no caller here uses it) — handed to the asker when Config.HandTo
// allows, else released — and answers whether it did. A hold in use is
// left alone. With no hold of the group here at all, a record that
// names this process as the holder is an orphan (a hold handed here
// whose answer never arrived, a release that could not reach the store)
// and is released. The asker's process (to.Node), when known, is asked
// first by this process's next Acquire of the group within Linger
// (Locks.handedTo).
func (l *Locks) YieldIdle(ctx context.Context, group string, to Asker) Answer {
	l.mu.Lock()
	s := l.slots[group]
	if s == nil {
		l.mu.Unlock()
		return Answer{Released: l.freeOrphan(ctx, group)}
	}
	if !s.lingering {
		l.mu.Unlock()
		return Answer{}
	}
	h := s.hold
	s.linger.Stop() // if it fired, endLinger finds the hold taken
	s.hold, s.lingering = nil, false
	given := l.givingUp(group)
	l.mu.Unlock()
	// Released (and announced) as at the linger's end, and as bounded:
	// once taken off the slot the hold is given up whatever the asker
	// does meanwhile.
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	hv, err := l.giveUp(gctx, group, s, h, given, to)
	if err != nil {
		return Answer{}
	}
	if to.Node != "" && to.Node != l.cfg.Node {
		l.mu.Lock()
		if l.handedTo == nil || len(l.handedTo) >= maxHandedTo {
			l.handedTo = map[string]handOver{}
		}
		l.handedTo[group] = handOver{node: to.Node, at: l.cfg.Now()}
		l.noteHeldAtLocked(group, to.Node)
		l.mu.Unlock()
	}
	return Answer{Released: true, Handed: hv}
}

// freeOrphan releases group's lock when the store shows it held by this
// process (Config.Node) while nothing here holds it, acquires it or gives
// it up, and reports whether it did. The local slot is held meanwhile, so
// no Acquire here takes the record over between the read and the write.
func (l *Locks) freeOrphan(ctx context.Context, group string) bool {
	if l.cfg.Node == "" {
		return false
	}
	s := l.refSlot(group)
	select {
	case s.ch <- struct{}{}:
	default:
		l.drop(group, s) // an Acquire here holds it: not an orphan
		return false
	}
	defer l.unlockLocal(group, s)
	l.mu.Lock()
	busy := s.hold != nil || l.giving[group] != nil
	l.mu.Unlock()
	if busy {
		return false
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	key := Key(group)
	rec, etag, err := l.read(ctx, key)
	if err != nil || !rec.Held || rec.Node != l.cfg.Node {
		return false
	}
	rec.Held = false
	if l.put(ctx, key, rec, etag) != nil {
		return false
	}
	l.emit(Event{Kind: EventReleased, Group: group, Holder: rec.Holder, Token: rec.Token})
	return true
}

// givingUp records that group's hold is being given up in the background
// (Locks.giving); the caller holds l.mu and calls the returned function
// once the hold is released.
func (l *Locks) givingUp(group string) func() {
	if l.giving == nil {
		l.giving = map[string]chan struct{}{}
	}
	ch := make(chan struct{})
	l.giving[group] = ch
	return func() {
		l.mu.Lock()
		if l.giving[group] == ch {
			delete(l.giving, group)
		}
		l.mu.Unlock()
		close(ch)
	}
}

// afterGivingUp waits until no hold of group is being given up here
// (Locks.giving), or ctx ends.
func (l *Locks) afterGivingUp(ctx context.Context, group string) error {
	for {
		l.mu.Lock()
		ch := l.giving[group]
		l.mu.Unlock()
		if ch == nil {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// ReleaseIdle gives up every hold that lingers (Config.Linger) at once:
// on shutdown, so that peers need not wait for the timers.
func (l *Locks) ReleaseIdle(ctx context.Context) {
	type parked struct {
		group string
		s     *slot
		h     *hold
	}
	var all []parked
	l.mu.Lock()
	var given []func()
	for group, s := range l.slots {
		if s.lingering {
			s.linger.Stop()
			all = append(all, parked{group, s, s.hold})
			s.hold, s.lingering = nil, false
			given = append(given, l.givingUp(group))
		}
	}
	l.mu.Unlock()
	for i, p := range all {
		_ = p.h.idle(ctx)
		_ = p.h.release(ctx, p.h.holder)
		given[i]()
		l.drop(p.group, p.s)
	}
}

// refSlot returns group's local slot, made when there is none, with one
// more reference (drop lets it go).
func (l *Locks) refSlot(group string) *slot {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.slots[group]
	if s == nil {
		s = &slot{ch: make(chan struct{}, 1)}
		l.slots[group] = s
	}
	s.refs++
	return s
}

// lockLocal takes group's local slot, waiting as long as ctx allows.
func (l *Locks) lockLocal(ctx context.Context, group string) (*slot, error) {
	s := l.refSlot(group)
	select {
	case s.ch <- struct{}{}:
		return s, nil
	default:
	}
	if l.localWait != nil {
		l.localWait(group)
	}
	select {
	case s.ch <- struct{}{}:
		return s, nil
	case <-ctx.Done():
		l.drop(group, s)
		return nil, ctx.Err()
	}
}

// unlockLocal frees group's local slot taken by lockLocal.
func (l *Locks) unlockLocal(group string, s *slot) {
	<-s.ch
	l.drop(group, s)
}

func (l *Locks) drop(group string, s *slot) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s.refs--; s.refs == 0 {
		delete(l.slots, group)
		if h := s.hold; h != nil {
			// Kept for a caller that gave up waiting: nobody here needs
			// it any more, so it is released (in the background: drop
			// runs under l.mu and on the caller's path).
			s.hold = nil
			given := l.givingUp(group)
			go func() {
				defer given()
				// After the side effects of leases that yielded (bounded:
				// a lease that does not end is the dispatcher's bug).
				wctx, wcancel := context.WithTimeout(context.Background(), time.Minute)
				_ = h.idle(wctx)
				wcancel()
				ctx, cancel := context.WithTimeout(context.Background(), undoTimeout)
				defer cancel()
				_ = h.release(ctx, h.holder)
			}()
		}
	}
}

func (l *Locks) emit(ev Event) {
	if l.cfg.OnEvent == nil {
		return
	}
	ev.At = l.cfg.Now()
	ev.Group, ev.Key, _ = strings.Cut(ev.Group, keySep)
	ev.Tenant, _ = split(ev.Group)
	l.cfg.OnEvent(ev)
}

// backoff is the sleep after try number try (0-based): base<<try, without
// overflowing.
func backoff(base time.Duration, try int) time.Duration {
	d := base
	for i := 0; i < try && d < time.Duration(1<<62); i++ {
		d *= 2
	}
	return d
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
