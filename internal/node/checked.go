package node

import (
	"sync"
	"time"

	"github.com/virtufin/workmanager/internal/catalog"
)

// checkedCode hands the bodies this node checked (Check, in a create's,
// reload's or rollback's PrepareCode) to the load that follows on the
// same node (Apply, in the same workflow task), which otherwise reads the
// body from the state store again: measured on make test's stack, 0.2–0.6
// ms for a 379-byte Python source and 0.8–1.7 ms for a 7.7 KiB native
// package, on every create and reload. Bodies are content-addressed: a
// body is kept under its own SHA-256 and only handed to a load of that
// SHA-256, so it is the code the record names. One load takes a body;
// at most checkedMax bodies and checkedMaxBytes are kept, each for
// checkedTTL (a check whose create was refused, or whose Apply ran on
// another node, leaves one behind until then).
type checkedCode struct {
	mu     sync.Mutex
	bodies map[string]checkedBody
	order  []string // oldest first
	bytes  int
}

type checkedBody struct {
	body []byte
	at   time.Time
}

// Bounds of checkedCode.
const (
	checkedMax      = 16
	checkedMaxBytes = 32 << 20
	checkedTTL      = time.Minute
)

// put keeps a copy of body, checked at now.
func (c *checkedCode) put(body []byte, now time.Time) {
	if len(body) > checkedMaxBytes/4 {
		return // a large body is read again rather than held
	}
	sha := catalog.SHA256(body)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bodies == nil {
		c.bodies = map[string]checkedBody{}
	}
	c.dropLocked(sha)
	for len(c.order) > 0 && (len(c.order) >= checkedMax || c.bytes+len(body) > checkedMaxBytes || now.Sub(c.bodies[c.order[0]].at) > checkedTTL) {
		c.dropLocked(c.order[0])
	}
	c.bodies[sha] = checkedBody{body: append([]byte(nil), body...), at: now}
	c.order = append(c.order, sha)
	c.bytes += len(body)
}

// take hands out the body kept under sha, checked no longer than
// checkedTTL before now, and forgets it.
func (c *checkedCode) take(sha string, now time.Time) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.bodies[sha]
	if ok {
		c.dropLocked(sha)
	}
	if !ok || now.Sub(b.at) > checkedTTL {
		return nil, false
	}
	return b.body, true
}

// dropLocked forgets the body kept under sha, if any (c.mu held).
func (c *checkedCode) dropLocked(sha string) {
	b, ok := c.bodies[sha]
	if !ok {
		return
	}
	delete(c.bodies, sha)
	c.bytes -= len(b.body)
	for i, s := range c.order {
		if s == sha {
			c.order = append(c.order[:i], c.order[i+1:]...)
			break
		}
	}
}
