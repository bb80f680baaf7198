package node

import (
	"context"
	"slices"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/dispatch"
)

// Placement tells which topics this node serves (internal/placement's
// Follower): the node attaches the running workers of those topics only.
type Placement interface {
	// Serves reports whether this node serves topic now.
	Serves(ctx context.Context, topic string) bool
	// CanRun reports whether this node may run a worker that requires
	// these labels ("" when it may, else why not).
	CanRun(require map[string]string) string
	// Unplaceable reports whether the placement found that no live node
	// can run worker id of topic.
	Unplaceable(topic, id string) bool
	// ServesByView is Serves without reading anything: a hint (Check).
	ServesByView(topic string) bool
}

// SetPlacement makes the node serve only the topics p places on it. Call
// it before serving; without it the node serves every topic.
func (n *Node) SetPlacement(p Placement) { n.place = p }

// placedHere reports whether this node serves w's topic.
func (n *Node) placedHere(ctx context.Context, w catalog.Worker) bool {
	return n.place == nil || n.place.Serves(ctx, w.Topic)
}

// cannotRun says why this node may not run w although it serves its topic
// (a label w requires that the node lacks), "" when it may.
func (n *Node) cannotRun(w catalog.Worker) string {
	if n.place == nil || w.Placement == nil || len(w.Placement.Require) == 0 {
		return ""
	}
	return n.place.CanRun(w.Placement.Require)
}

// unplaceable reports whether no live node can run w (the placement
// record says so).
func (n *Node) unplaceable(w catalog.Worker) bool {
	return n.place != nil && n.place.Unplaceable(w.Topic, w.ID)
}

// unplace stops serving w here because its topic is served elsewhere: it
// is parked (dispatch.Park) without a word in the log, since most of the
// catalog is unplaced on any one node. The caller holds its lock.
func (n *Node) unplace(ctx context.Context, w dispatch.Worker) {
	n.mu.Lock()
	_, was := n.attached[w.ID]
	delete(n.broken, w.ID)
	n.mu.Unlock()
	if !was && n.disp.Unrunnable(w.ID) && !n.disp.Held(w.ID) {
		return
	}
	n.disp.Park(ctx, w) // a held worker's topic is let go too
	n.forget(w.ID)
	if was {
		n.log.Info("worker's topic moved to other nodes: detached here", "worker_id", w.ID, "topic", w.Topic)
	}
}

// ConvergeResult counts what ConvergePlacement changed.
type ConvergeResult struct {
	// Attached and Detached count workers; Topics lists the topics this
	// node serves afterwards.
	Attached, Detached, Failed int
	Topics                     []string
}

// ConvergePlacement makes the node match its placement: the workers of
// topics it no longer serves are parked, every running worker of a topic it
// serves now is attached. A topic it gains has all its running workers
// marked not runnable here before the first one attaches (and subscribes),
// so that none of its messages is acked here before every worker is
// attached (as expectRunning does at start). It returns once every worker
// of its topics is attached or failed (Reconcile's parallelism).
func (n *Node) ConvergePlacement(ctx context.Context) (ConvergeResult, error) {
	var res ConvergeResult
	// Leave first: what moved away is parked before anything new loads.
	n.mu.Lock()
	var attached []dispatch.Worker
	for id := range n.attached {
		if p, ok := n.policy[id]; ok {
			attached = append(attached, p)
		}
	}
	n.mu.Unlock()
	for _, w := range attached {
		if n.servesTopic(ctx, w.Topic) {
			continue
		}
		unlock := n.lockWorker(w.ID)
		n.mu.Lock()
		p, ok := n.policy[w.ID]
		n.mu.Unlock()
		if ok && !n.servesTopic(ctx, p.Topic) {
			n.unplace(ctx, p)
			res.Detached++
		}
		unlock()
	}
	// A worker held here (no live node can run it) whose topic moved away
	// lets its topic go: its messages are the new nodes' to give back or
	// dead-letter, or to run once a node that can run it serves them.
	for _, w := range n.disp.HeldWorkers() {
		if !n.servesTopic(ctx, w.Topic) {
			unlock := n.lockWorker(w.ID)
			if n.disp.Held(w.ID) && !n.servesTopic(ctx, w.Topic) {
				n.disp.Park(ctx, w)
			}
			unlock()
		}
	}
	ids, err := n.catalog.WorkerIDs(ctx)
	if err != nil {
		return res, err
	}
	// A worker attached here stays as it is (its topic is served: the
	// leave step above parked the others), so only the records of the
	// workers not attached here are read: on a node that runs most of the
	// catalog a convergence reads almost nothing.
	var here []string
	n.mu.Lock()
	for _, p := range n.policy {
		if _, ok := n.attached[p.ID]; ok {
			here = append(here, p.Topic)
		}
	}
	n.mu.Unlock()
	topics := map[string]bool{}
	for _, t := range here {
		if !topics[t] && n.servesTopic(ctx, t) {
			topics[t] = true
		}
	}
	ids = slices.DeleteFunc(ids, n.disp.Attached)
	ws, err := n.catalog.GetWorkers(ctx, ids)
	if err != nil {
		return res, err
	}
	var todo []catalog.Worker
	for _, w := range ws {
		if w.Status != catalog.StatusRunning || !n.servesTopic(ctx, w.Topic) {
			continue
		}
		topics[w.Topic] = true
		if !n.disp.Attached(w.ID) {
			n.disp.SetUnrunnable(n.hotPath(w)) // before any of its topic attaches
			todo = append(todo, w)
		}
	}
	var g errgroup.Group
	g.SetLimit(max(n.parallelism, 1))
	results := make([]error, len(todo))
	for i, w := range todo {
		g.Go(func() error {
			_, results[i] = n.reconcileOne(ctx, w.ID)
			return nil
		})
	}
	_ = g.Wait()
	for _, err := range results {
		if err != nil {
			res.Failed++
		} else {
			res.Attached++
		}
	}
	for t := range topics {
		res.Topics = append(res.Topics, t)
	}
	slices.Sort(res.Topics)
	return res, nil
}

func (n *Node) servesTopic(ctx context.Context, topic string) bool {
	return n.place == nil || n.place.Serves(ctx, topic)
}

// WaitSubscribed waits until this node holds a confirmed subscription to
// each of topics that has a worker attached here, or ctx ends; it returns
// the topics still not subscribed.
func (n *Node) WaitSubscribed(ctx context.Context, topics []string) []string {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		var missing []string
		for _, topic := range topics {
			if !n.disp.Subscribed(topic) && n.hasAttached(topic) {
				missing = append(missing, topic)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return missing
		case <-t.C:
		}
	}
}

func (n *Node) hasAttached(topic string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for id := range n.attached {
		if n.policy[id].Topic == topic {
			return true
		}
	}
	return false
}

// Share counts the running workers of the catalog whose topics this node
// serves, and how many of them are attached here (readiness: recovered N
// of M).
func (n *Node) Share(ctx context.Context) (attached, share int, err error) {
	ids, err := n.catalog.WorkerIDs(ctx)
	if err != nil {
		return 0, 0, err
	}
	ws, err := n.catalog.GetWorkers(ctx, ids)
	if err != nil {
		return 0, 0, err
	}
	for _, w := range ws {
		if w.Status == catalog.StatusRunning && n.servesTopic(ctx, w.Topic) {
			share++
			if n.disp.Attached(w.ID) {
				attached++
			}
		}
	}
	return attached, share, nil
}
