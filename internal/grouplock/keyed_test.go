package grouplock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

// ttlStore records the TTL of each Put.
type ttlStore struct {
	*state.MemoryStore
	ttls map[string]time.Duration
}

func (s *ttlStore) Put(ctx context.Context, key string, value []byte, opts state.PutOptions) error {
	s.ttls[key] = opts.TTL
	return s.MemoryStore.Put(ctx, key, value, opts)
}

// Issue 47 item 2: one key of a keyed group excludes only itself; other
// keys (and the group's own lock) are held at the same time. A key's
// tokens start above the clock floor and only grow, also after its lock
// expired; every write of a keyed lock carries the key TTL; the events
// name the group and the key apart.
func TestKeyedLocksArePerKey(t *testing.T) {
	w := newWorld(t)
	st := &ttlStore{MemoryStore: w.mem, ttls: map[string]time.Duration{}}
	n := w.node(st, func(c *Config) { c.Node, c.MaxRetries, c.KeyTTL = "a", -1, 10*time.Minute })
	ctx := context.Background()
	k1, k2 := KeyedName("orders", "order-1"), KeyedName("orders", "order-2")
	a := mustAcquire(t, n, k1, "a/w")
	b := mustAcquire(t, n, k2, "a/w") // another key: not excluded
	g := mustAcquire(t, n, "orders", "a/w")
	floor := w.clk.Now().UnixMilli() * TimeTokens
	if a.Token <= floor || b.Token <= floor || g.Token != 1 {
		t.Fatalf("tokens %d %d (floor %d), group %d", a.Token, b.Token, floor, g.Token)
	}
	other := w.node(nil, func(c *Config) { c.Node, c.MaxRetries = "b", -1 })
	if _, err := other.Acquire(ctx, k1, "b/w"); !errors.Is(err, ErrContended) {
		t.Fatalf("another node's acquisition of a held key: %v, want ErrContended", err)
	}
	for _, ls := range []*Lease{a, b, g} {
		mustRelease(t, ls)
	}
	if ttl := st.ttls[Key(k1)]; ttl != 10*time.Minute {
		t.Fatalf("keyed lock written with TTL %s", ttl)
	}
	if ttl := st.ttls[Key("orders")]; ttl != 0 {
		t.Fatalf("a group's lock written with TTL %s: group locks are permanent", ttl)
	}
	// The key's lock expires; it comes back later with a larger token.
	if err := w.mem.Delete(ctx, Key(k1), ""); err != nil {
		t.Fatal(err)
	}
	w.clk.Advance(time.Millisecond)
	again := mustAcquire(t, n, k1, "a/w")
	if again.Token <= a.Token {
		t.Fatalf("token %d after the key's lock expired, want above %d", again.Token, a.Token)
	}
	mustRelease(t, again)
	evs := n.ev.all()
	if ev := evs[0]; ev.Group != "orders" || ev.Key != "order-1" || ev.Kind != EventAcquired {
		t.Fatalf("event %+v: want group orders, key order-1", ev)
	}
}

// A key an event controls never makes a long or odd state key: anything
// but a short plain key is hashed.
func TestKeyedNameBoundsTheKey(t *testing.T) {
	for key, plain := range map[string]bool{"order-1": true, "A.b_c~d": true, "": false, "~x": false, "a/b": false, "ü": false, strings.Repeat("k", 65): false, strings.Repeat("k", 64): true} {
		name := KeyedName("g", key)
		enc := strings.TrimPrefix(name, "g#")
		if plain && enc != key {
			t.Errorf("key %q: %q, want it as it is", key, name)
		}
		if !plain && (!strings.HasPrefix(enc, "~") || len(enc) != 41) {
			t.Errorf("key %q: %q, want ~ and 40 hex digits", key, name)
		}
	}
	if KeyedName("g", "a/b") == KeyedName("g", "a/c") {
		t.Error("two keys hashed alike")
	}
}
