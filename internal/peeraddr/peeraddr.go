// Package peeraddr owns finding the HTTP address a peer node advertises
// (its WORKMANAGER_ADVERTISE_ADDR, in its node record) and remembering
// it for a while: a group lock's questions to its holder
// (grouplock.HTTPNotifier) and the turns forwarded to it
// (dispatch.HTTPForwarder) go there. A node whose request failed is left
// alone for a while (Quiet), so that a paused or cut-off node does not
// cost a timeout on every message.
package peeraddr

import (
	"context"
	"sync"
	"time"
)

// TTL is how long a looked-up address is used before it is looked up
// again.
const TTL = 30 * time.Second

// maxNodes bounds the cache: past it, it starts again empty (nodes come
// and go; the live ones are looked up again).
const maxNodes = 1024

// Cache looks addresses up with its lookup function (host:port; "" when
// the node advertises none) and remembers them for TTL. Safe for
// concurrent use.
type Cache struct {
	lookup func(ctx context.Context, node string) (string, error)

	mu    sync.Mutex
	addrs map[string]entry
}

type entry struct {
	addr  string
	at    time.Time
	quiet time.Time // nothing is returned for the node before this time
}

// New returns a Cache over lookup.
func New(lookup func(ctx context.Context, node string) (string, error)) *Cache {
	return &Cache{lookup: lookup, addrs: map[string]entry{}}
}

// Addr returns node's address: "" when it advertises none, its lookup
// failed, or it is quiet (Quiet).
func (c *Cache) Addr(ctx context.Context, node string) string {
	c.mu.Lock()
	e, ok := c.addrs[node]
	c.mu.Unlock()
	if ok && time.Now().Before(e.quiet) {
		return ""
	}
	if ok && e.quiet.IsZero() && time.Since(e.at) < TTL {
		return e.addr
	}
	a, err := c.lookup(ctx, node)
	if err != nil {
		return ""
	}
	c.mu.Lock()
	if cur, ok := c.addrs[node]; ok && time.Now().Before(cur.quiet) {
		// A request to the node failed while this lookup ran: it stays
		// quiet (the lookup's answer would make the next messages wait out
		// the same failure again).
		c.mu.Unlock()
		return ""
	}
	if len(c.addrs) >= maxNodes {
		clear(c.addrs)
	}
	c.addrs[node] = entry{addr: a, at: time.Now()}
	c.mu.Unlock()
	return a
}

// Quiet makes Addr return "" for node for d (a request to it failed or
// timed out); its address is looked up again after.
func (c *Cache) Quiet(node string, d time.Duration) {
	c.mu.Lock()
	if len(c.addrs) >= maxNodes {
		clear(c.addrs)
	}
	c.addrs[node] = entry{quiet: time.Now().Add(d)}
	c.mu.Unlock()
}

// Forget makes the next Addr look node up again (its connection was
// refused: it may have restarted elsewhere).
func (c *Cache) Forget(node string) {
	c.mu.Lock()
	delete(c.addrs, node)
	c.mu.Unlock()
}
