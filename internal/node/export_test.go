package node

import (
	"time"

	"github.com/virtufin/workmanager/engines/lull"
	"github.com/virtufin/workmanager/internal/catalog"
)

// SetClock replaces the node's clock (Reconcile's backoff).
func SetClock(n *Node, now func() time.Time) { n.now = now }

// TimeoutOf is timeoutOf, for tests.
func (n *Node) TimeoutOf(w catalog.Worker) time.Duration { return n.timeoutOf(w) }

// SetCalls replaces the gate the node marks its calls on.
func SetCalls(n *Node, g *lull.Gate) { n.calls = g }
