package grouplock

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/virtufin/workmanager/internal/state"
)

// Issue 30, item 5: locks are per tenant. A group of one name held by one
// tenant does not hold up another tenant's; each has its own key
// (grouplock/<tenant>/<group>; the default tenant's keeps its bare key),
// its own tokens, and its events name the tenant.
func TestLocksArePerTenant(t *testing.T) {
	w := newWorld(t)
	n := w.node(nil, func(c *Config) { c.MaxRetries = -1 })
	acme, globex, def := Name("acme", "g"), Name("globex", "g"), Name("default", "g")
	if acme != "acme/g" || def != "g" || Name("", "g") != "g" {
		t.Fatalf("names %q %q %q", acme, def, Name("", "g"))
	}
	if Key(acme) != state.KeyPrefix+"grouplock/acme/g" {
		t.Fatalf("key %q", Key(acme))
	}
	a := mustAcquire(t, n, acme, "n1/acme.w")
	b := mustAcquire(t, n, globex, "n1/globex.w") // would wait for a's local slot, or be contended, if shared
	c := mustAcquire(t, n, def, "n1/w")
	if a.Token != 1 || b.Token != 1 || c.Token != 1 {
		t.Fatalf("tokens %d %d %d, want each tenant's first", a.Token, b.Token, c.Token)
	}
	if r := w.record(acme); r.Holder != "n1/acme.w" || !r.Held {
		t.Fatalf("acme's record %+v", r)
	}
	for _, ls := range []*Lease{a, b, c} {
		mustRelease(t, ls)
	}
	var tenants []string
	for _, ev := range n.ev.all() {
		if ev.Kind == EventAcquired {
			tenants = append(tenants, ev.Tenant+":"+ev.Group)
		}
	}
	if got := strings.Join(tenants, ","); got != "acme:acme/g,globex:globex/g,:g" {
		t.Fatalf("acquired events %s", got)
	}
}

// Issue 30, item 2: a holder whose membership lapsed (peers may count it
// as gone and take its lock, written or not) reads the store before each
// side effect: a lock taken meanwhile is stale, not trusted from memory.
func TestCheckReadsTheStoreWhenMembershipLapsed(t *testing.T) {
	w := newWorld(t)
	member := true
	a := w.node(nil, func(c *Config) { c.Node = "a"; c.SelfAlive = func() bool { return member } })
	b := w.node(nil, func(c *Config) {
		c.Node = "b"
		c.HolderAlive = func(holder string) bool { return !strings.HasPrefix(holder, "a/") }
	})
	ctx := context.Background()
	ls := mustAcquire(t, a, "g", "a/w")
	if err := ls.Check(ctx); err != nil { // records wrote=true
		t.Fatal(err)
	}
	member = false                         // a missed its heartbeats, or left on SIGTERM
	taken := mustAcquire(t, b, "g", "b/w") // b sees a gone and takes the written lock
	if err := ls.Check(ctx); !errors.Is(err, ErrStale) {
		t.Fatalf("Check after the lock was taken: %v, want ErrStale", err)
	}
	mustRelease(t, taken)
}
