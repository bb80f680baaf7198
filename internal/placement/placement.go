// Package placement owns which nodes serve which topics: the unit of
// placement is the topic (every running worker of a topic is served by the
// same set of nodes, so any node that receives one of its messages can
// complete it for every worker). It holds the placement record (one
// revision-guarded key in the state store, written only by the placement
// workflow's activities), what each node advertises about itself (its
// labels, the engines it can run, its memory: one key per node) and Plan,
// the pure function that turns nodes, workers and the previous record into
// the next one (rendezvous hashing with bounded load and constraints, so
// that a change of membership moves few topics).
package placement

import (
	"maps"
	"slices"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

// RecordKey holds the placement record (Record).
const RecordKey = state.KeyPrefix + "placement"

// NodeInfoPrefix prefixes each node's advertisement (NodeInfo): one key per
// node, written only by that node.
const NodeInfoPrefix = state.KeyPrefix + "nodeinfo/"

// EventTopic carries placement changes (infrastructure events).
const EventTopic = "workmanager.infra.placement"

// DefaultReplicas is PLACEMENT_REPLICAS' default: each topic is served by
// this many nodes (all live nodes when fewer).
const DefaultReplicas = 2

// All, as a worker's replicas, makes its topic served by every live node
// that can run it (today's behaviour before placement).
const All = 0

// NodeInfo is what a node advertises about itself.
type NodeInfo struct {
	ID string `json:"id"`
	// Addr is the node's HTTP address as its peers reach it
	// (WORKMANAGER_ADVERTISE_ADDR): a node waiting for a group lock that
	// only lingers here asks for it there (grouplock.YieldPath). Empty:
	// none, peers poll.
	Addr string `json:"addr,omitempty"`
	// Labels are the node's NODE_LABELS (zone=a,pool=cpu).
	Labels map[string]string `json:"labels,omitempty"`
	// Engines are the names of the engines whose runtime check is Healthy
	// on the node ("python", "dotnet", "native"): a worker of another
	// engine is not placed there.
	Engines []string `json:"engines,omitempty"`
	// MIMETypes are the worker MIME types those engines serve: the control
	// API accepts a MIME type some live node advertises (an engine
	// registered outside engines/builtin included).
	MIMETypes []string `json:"mime_types,omitempty"`
	// MemoryBytes is the node's memory (cgroup limit or MemTotal);
	// 0: unknown.
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
	// Workers, Topics and Processes count what the node serves now (for
	// wmctl nodes).
	Workers   int `json:"workers"`
	Topics    int `json:"topics"`
	Processes int `json:"processes,omitempty"`
	// StartedAt is when the node process started; UpdatedAt when this was
	// written.
	StartedAt time.Time `json:"started_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// CanRun reports whether the node runs engine and has every label of
// require.
func (n NodeInfo) CanRun(engine string, require map[string]string) bool {
	if engine != "" && !slices.Contains(n.Engines, engine) {
		return false
	}
	for k, v := range require {
		if n.Labels[k] != v {
			return false
		}
	}
	return true
}

// Need is what one running worker asks of placement.
type Need struct {
	WorkerID string `json:"worker_id"`
	Topic    string `json:"topic"`
	// Engine is the name of the worker's engine (NodeInfo.Engines).
	Engine string `json:"engine"`
	// Replicas is the worker's replicas: < 0 the cluster default, All (0)
	// every node that can run it, else that many nodes.
	Replicas int `json:"replicas"`
	// Require lists the labels a node must have to run the worker.
	Require map[string]string `json:"require,omitempty"`
	// Weight is the worker's cost on a node: 1 for an in-process worker,
	// more for a worker with processes of its own (Python, .NET).
	Weight int `json:"weight"`
}

// TopicPlacement is where one topic is served.
type TopicPlacement struct {
	// Nodes serve the topic: each attaches every running worker of it
	// and subscribes to it.
	Nodes []string `json:"nodes"`
	// Leaving still serve it while a move is under way (make before
	// break): a node in Leaving lets go only once every node of Nodes has
	// attached the topic.
	Leaving []string `json:"leaving,omitempty"`
	// Replicas is the number of nodes the topic asks for (All: every
	// node that can run it).
	Replicas int `json:"replicas"`
	// Unplaceable maps the id of a worker of the topic that no live node
	// can run to why.
	Unplaceable map[string]string `json:"unplaceable,omitempty"`
	// EnsuredAt is when a create or start placed the topic (Placer.Ensure):
	// a plan keeps it for KeepEnsured even without a running worker, whose
	// record is written only after the placement.
	EnsuredAt time.Time `json:"ensured_at,omitzero"`
}

// KeepEnsured is how long a plan keeps a topic a create or start placed
// while it has no running worker yet (the create's Apply writes the
// record after placing the topic, and may be retried for a few minutes).
const KeepEnsured = 5 * time.Minute

// Serving is every node that serves the topic now: Nodes and Leaving.
func (t TopicPlacement) Serving() []string {
	s := slices.Clone(t.Nodes)
	for _, n := range t.Leaving {
		if !slices.Contains(s, n) {
			s = append(s, n)
		}
	}
	slices.Sort(s)
	return s
}

// Record is the placement record.
type Record struct {
	// Revision grows with every write: a write of an older revision is
	// refused.
	Revision int64 `json:"revision"`
	// Topics maps each placed topic to its nodes.
	Topics map[string]TopicPlacement `json:"topics,omitempty"`
	// Drained lists the nodes that serve nothing (wmctl drain) until
	// undrained.
	Drained []string `json:"drained,omitempty"`
	// UpdatedAt is when the record was written.
	UpdatedAt time.Time `json:"updated_at"`
}

// Clone returns a deep copy of r.
func (r Record) Clone() Record {
	c := r
	c.Drained = slices.Clone(r.Drained)
	c.Topics = make(map[string]TopicPlacement, len(r.Topics))
	for k, t := range r.Topics {
		t.Nodes = slices.Clone(t.Nodes)
		t.Leaving = slices.Clone(t.Leaving)
		t.Unplaceable = maps.Clone(t.Unplaceable)
		c.Topics[k] = t
	}
	return c
}

// Options are Plan's settings.
type Options struct {
	// DefaultReplicas is the replicas of a worker that asks for none
	// (PLACEMENT_REPLICAS).
	DefaultReplicas int
	// MaxMoves bounds how many topics gain a node in one plan, except a
	// topic below its replicas because a node left, died or was drained
	// (those are always placed). 0: no bound.
	MaxMoves int
	// LoadSlack is how far above the mean load a node may be filled
	// (bounded-load rendezvous): 0.25 lets a node carry 125 % of the mean.
	// 0: 0.25.
	LoadSlack float64
}

// Move is one topic's change between two records.
type Move struct {
	Topic string `json:"topic"`
	// Add gain the topic; Remove lose it (once the added ones attached).
	Add    []string `json:"add,omitempty"`
	Remove []string `json:"remove,omitempty"`
}
