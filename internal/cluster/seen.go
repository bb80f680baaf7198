package cluster

import (
	"maps"
	"slices"
)

// SeenAlone reports whether this node's last successful heartbeat saw no
// other live node (false before the first one: unknown is not alone).
func (m *Members) SeenAlone() bool {
	set := m.seen.Load()
	if set == nil {
		return false
	}
	for node := range *set {
		if node != m.self {
			return false
		}
	}
	return true
}

// SeenNodes lists the nodes alive at this node's last successful heartbeat
// (sorted; this node alone before the first one).
func (m *Members) SeenNodes() []string {
	set := m.seen.Load()
	if set == nil {
		return []string{m.self}
	}
	return slices.Sorted(maps.Keys(*set))
}
