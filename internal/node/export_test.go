package node

import (
	"time"

	"github.com/virtufin/workmanager/internal/catalog"
)

// SetClock replaces the node's clock (Reconcile's backoff).
func SetClock(n *Node, now func() time.Time) { n.now = now }

// TimeoutOf is timeoutOf, for tests.
func (n *Node) TimeoutOf(w catalog.Worker) time.Duration { return n.timeoutOf(w) }
