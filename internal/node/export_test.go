package node

import "time"

// SetClock replaces the node's clock (Reconcile's backoff).
func SetClock(n *Node, now func() time.Time) { n.now = now }
