package cluster

import (
	"maps"
	"slices"
)

// SeenNodes lists the nodes alive at this node's last successful heartbeat
// (sorted; this node alone before the first one).
func (m *Members) SeenNodes() []string {
	set := m.seen.Load()
	if set == nil {
		return []string{m.self}
	}
	return slices.Sorted(maps.Keys(*set))
}
