package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/placement"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Issue 45 in the soak: each topic is served by placementReplicas of the
// nodes, chosen by the placement workflow (the record at
// placement.RecordKey). The faults node-join (one more node with its own
// daprd, stopped later) and node-drain (DrainNode through the API, undrained
// later) move topics between nodes, as kill9-node does once the killed
// node's heartbeats stop; the checker proves that after convergence every
// topic with running workers is placed on min(replicas, live undrained
// nodes that can run it) live nodes with no move under way, and that
// exactly those nodes' daprds subscribe to it (placementDivergence).

// placementReplicas and placementInterval are the nodes' PLACEMENT_REPLICAS
// and PLACEMENT_INTERVAL (nodeSettings).
const (
	placementReplicas = 2
	placementInterval = 5 * time.Second
)

// readStateKey reads one JSON value WorkManager keeps in the state store
// straight from Redis (the state store's hash, its data field; keyPrefix
// none): false when the key is absent.
func readStateKey(redisAddr, key string, into any) (bool, error) {
	r, err := dialRedis(redisAddr)
	if err != nil {
		return false, fmt.Errorf("connecting to Redis: %w", err)
	}
	defer r.close()
	v, err := r.do("HGET", key, "data")
	if err != nil {
		return false, fmt.Errorf("reading %s: %w", key, err)
	}
	s, ok := v.(string)
	if !ok {
		return false, nil
	}
	if err := json.Unmarshal([]byte(s), into); err != nil {
		// Stored as a JSON string holding the JSON.
		var inner string
		if json.Unmarshal([]byte(s), &inner) != nil || json.Unmarshal([]byte(inner), into) != nil {
			return false, fmt.Errorf("decoding %s: %w (%.200s)", key, err, s)
		}
	}
	return true, nil
}

// readPlacement reads the placement record (revision 0 when none).
func readPlacement(redisAddr string) (placement.Record, error) {
	var rec placement.Record
	_, err := readStateKey(redisAddr, placement.RecordKey, &rec)
	return rec, err
}

// served lists the topics of topics that rec has node id serve (in Nodes
// or Leaving).
func served(rec placement.Record, id string, topics []string) []string {
	var out []string
	for _, t := range topics {
		if slices.Contains(rec.Topics[t].Serving(), id) {
			out = append(out, t)
		}
	}
	return out
}

// placedLine is the record's placement of topics, for notes and the report.
func placedLine(rec placement.Record, topics []string) string {
	var parts []string
	for _, t := range topics {
		tp, ok := rec.Topics[t]
		switch {
		case !ok:
			parts = append(parts, t+" unplaced")
		case len(tp.Leaving) > 0:
			parts = append(parts, fmt.Sprintf("%s → %s (leaving %s)", t, strings.Join(tp.Nodes, ","), strings.Join(tp.Leaving, ",")))
		default:
			parts = append(parts, fmt.Sprintf("%s → %s", t, strings.Join(tp.Nodes, ",")))
		}
	}
	drained := "none"
	if len(rec.Drained) > 0 {
		drained = strings.Join(rec.Drained, ",")
	}
	return fmt.Sprintf("revision %d: %s; drained: %s", rec.Revision, strings.Join(parts, "; "), drained)
}

// liveNodes are the run's nodes neither killed nor stopped, their process
// running.
func (c *cluster) liveNodes() []*node {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*node
	for _, n := range c.nodes {
		if !n.down && !n.stopped && n.proc != nil && !n.proc.Exited() {
			out = append(out, n)
		}
	}
	return out
}

// subscribed is the set of topics node n's daprd subscribes to.
func (c *cluster) subscribed(n *node) (map[string]bool, error) {
	c.mu.Lock()
	port := argAfter(n.daprd.Cmd.Args, "--dapr-http-port")
	c.mu.Unlock()
	subs, err := subscriptions("127.0.0.1:" + port)
	if err != nil {
		return nil, fmt.Errorf("daprd of %s: %w", n.id, err)
	}
	return subs, nil
}

// placementDivergence is "" when placement has converged
// (placementCheck): it reads the placement record, the live nodes'
// advertisements and their daprds' subscriptions, and the engines of the
// workers the journal has running on each topic.
func (c *cluster) placementDivergence(j *journal, topics []string) string {
	rec, err := readPlacement(c.stack.RedisAddr)
	if err != nil {
		return "placement record: " + err.Error()
	}
	in := placementInput{rec: rec, infos: map[string]placement.NodeInfo{}, subs: map[string]map[string]bool{},
		engines: map[string]map[string]bool{}, running: map[string][]string{}}
	for _, n := range c.liveNodes() {
		var info placement.NodeInfo
		ok, err := readStateKey(c.stack.RedisAddr, placement.NodeInfoPrefix+n.id, &info)
		if err != nil {
			return fmt.Sprintf("node %s's advertisement: %v", n.id, err)
		}
		if !ok {
			return fmt.Sprintf("node %s advertises nothing at %s", n.id, placement.NodeInfoPrefix+n.id)
		}
		in.live = append(in.live, n.id)
		in.infos[n.id] = info
		if in.subs[n.id], err = c.subscribed(n); err != nil {
			return err.Error()
		}
	}
	j.mu.Lock()
	for id, w := range j.workers {
		if w.current() == running {
			if in.engines[w.topic] == nil {
				in.engines[w.topic] = map[string]bool{}
			}
			in.engines[w.topic][w.kind] = true
			in.running[w.topic] = append(in.running[w.topic], id)
		}
	}
	j.mu.Unlock()
	return placementCheck(in, topics)
}

// placementInput is what placementCheck judges.
type placementInput struct {
	rec     placement.Record
	live    []string                      // the live nodes' ids
	infos   map[string]placement.NodeInfo // each live node's advertisement
	subs    map[string]map[string]bool    // each live node's daprd's subscriptions
	engines map[string]map[string]bool    // topic → engines of its running workers
	running map[string][]string           // topic → ids of its running workers
}

// placementCheck is "" when placement has converged: every topic of
// topics with running workers is placed on min(placementReplicas, live
// undrained nodes that can run all its running workers) nodes, each of
// them live, undrained and able to run them (their advertisement's
// engines), none leaving and no running worker of it unplaceable; and on
// every live node the daprd subscribes to the topic exactly when the node
// is one of them. Else it says the first divergence.
func placementCheck(in placementInput, topics []string) string {
	rec := in.rec
	for _, topic := range topics {
		if len(in.engines[topic]) == 0 {
			continue
		}
		var eligible []string
		for _, id := range in.live {
			if slices.Contains(rec.Drained, id) {
				continue
			}
			can := true
			for e := range in.engines[topic] {
				can = can && in.infos[id].CanRun(e, nil)
			}
			if can {
				eligible = append(eligible, id)
			}
		}
		want := min(placementReplicas, len(eligible))
		tp, ok := rec.Topics[topic]
		if !ok {
			return fmt.Sprintf("topic %s has running workers but is not in the placement record (%s)", topic, placedLine(rec, topics))
		}
		if len(tp.Leaving) > 0 {
			return fmt.Sprintf("topic %s: a move under way (%s)", topic, placedLine(rec, topics))
		}
		if len(tp.Nodes) != want {
			return fmt.Sprintf("topic %s placed on %d nodes %v, want %d: min(%d, live undrained nodes that can run it %v) (%s)",
				topic, len(tp.Nodes), tp.Nodes, want, placementReplicas, eligible, placedLine(rec, topics))
		}
		for _, id := range tp.Nodes {
			if !slices.Contains(eligible, id) {
				return fmt.Sprintf("topic %s placed on %s, not a live undrained node that can run it %v (%s)", topic, id, eligible, placedLine(rec, topics))
			}
		}
		if len(eligible) > 0 {
			for _, id := range in.running[topic] {
				if why, ok := tp.Unplaceable[id]; ok {
					return fmt.Sprintf("topic %s: running worker %s reported unplaceable (%s) though %v can run it", topic, id, why, eligible)
				}
			}
		}
		for _, id := range in.live {
			if placed := slices.Contains(tp.Nodes, id); in.subs[id][topic] != placed {
				return fmt.Sprintf("topic %s: daprd of %s subscribed %v, placed there %v (%s)", topic, id, in.subs[id][topic], placed, placedLine(rec, topics))
			}
		}
	}
	return ""
}

// placementServed is the checker's placement invariant, read once after
// convergence: placementDivergence holds, one check per topic with running
// workers. line says where each topic is placed.
func (c *cluster) placementServed(j *journal, topics []string) (*invariant, string) {
	iv := &invariant{name: fmt.Sprintf("after convergence, every topic with running workers placed on min(%d, live undrained nodes that can run it) live nodes, none leaving, "+
		"each subscribed to it on its own daprd and no other node", placementReplicas)}
	withRunning := map[string]bool{}
	j.mu.Lock()
	for _, w := range j.workers {
		if w.current() == running {
			withRunning[w.topic] = true
		}
	}
	j.mu.Unlock()
	for _, t := range topics {
		if withRunning[t] {
			iv.checked++
		}
	}
	if d := c.placementDivergence(j, topics); d != "" {
		iv.fail("%s", d)
	}
	rec, err := readPlacement(c.stack.RedisAddr)
	if err != nil {
		return iv, "placement after convergence: " + err.Error()
	}
	return iv, "placement after convergence: " + placedLine(rec, topics)
}

// waitPlacement reads the placement record every half second until cond
// holds or d passes: how long it took, the last record read and whether
// cond held.
func (c *cluster) waitPlacement(ctx context.Context, d time.Duration, cond func(placement.Record) bool) (time.Duration, placement.Record, bool) {
	began := time.Now()
	var rec placement.Record
	for {
		if r, err := readPlacement(c.stack.RedisAddr); err == nil {
			rec = r
			if cond(rec) {
				return time.Since(began), rec, true
			}
		}
		if time.Since(began) >= d || ctx.Err() != nil {
			return time.Since(began), rec, false
		}
		sleepCtx(ctx, 500*time.Millisecond)
	}
}

// drainCall asks the API to drain (or undrain) node id, retrying for up to
// two minutes while the API fails (a fault may be under way).
func (c *cluster) drainCall(j *journal, id string, undrain bool) error {
	what := map[bool]string{false: "DrainNode", true: "DrainNode(undrain)"}[undrain]
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
		_, err := c.client.DrainNode(ctx, &pb.DrainNodeRequest{NodeId: id, Undrain: undrain})
		cancel()
		if err == nil {
			return nil
		}
		switch status.Code(err) {
		case codes.InvalidArgument, codes.NotFound, codes.PermissionDenied, codes.Unauthenticated, codes.Unimplemented:
			return fmt.Errorf("%s of %s refused: %w", what, id, err)
		}
		j.mu.Lock()
		j.apiErrors[what]++
		j.mu.Unlock()
		j.logf("%s %s %s failed: %v", j.rel(time.Now()), what, id, err)
		if time.Now().After(deadline) {
			return fmt.Errorf("%s of %s: still failing after 2 minutes: %w", what, id, err)
		}
		time.Sleep(2 * time.Second)
	}
}

// drainNode is node-drain: it drains node n through the API, waits (up to
// down) until the record shows n drained and serving none of topics and
// n's daprd subscribes to none of them, keeps it drained for down and
// undrains it. Its note says what n served, how long emptying took and
// where the topics went.
func (c *cluster) drainNode(ctx context.Context, j *journal, n *node, topics []string, down time.Duration) (string, error) {
	began := time.Now()
	before, err := readPlacement(c.stack.RedisAddr)
	if err != nil {
		return "", err
	}
	had := served(before, n.id, topics)
	if err := c.drainCall(j, n.id, false); err != nil {
		return fmt.Sprintf("served %v", had), err
	}
	answered := time.Since(began)
	took, rec, ok := c.waitPlacement(ctx, down, func(rec placement.Record) bool {
		if !slices.Contains(rec.Drained, n.id) || len(served(rec, n.id, topics)) > 0 {
			return false
		}
		subs, err := c.subscribed(n)
		if err != nil {
			return false
		}
		for _, t := range topics {
			if subs[t] {
				return false
			}
		}
		return true
	})
	note := fmt.Sprintf("served %v; drain answered in %s; ", had, answered.Round(100*time.Millisecond))
	if ok {
		note += fmt.Sprintf("emptied (record and its daprd's subscriptions) %s after the drain: %s", (answered + took).Round(100*time.Millisecond), placedLine(rec, topics))
	} else {
		note += fmt.Sprintf("NOT emptied within %s: %s", down, placedLine(rec, topics))
	}
	sleepCtx(ctx, time.Until(began.Add(down)))
	err = c.drainCall(j, n.id, true)
	note += fmt.Sprintf("; undrained after %s", time.Since(began).Round(100*time.Millisecond))
	return note, err
}

// joinNode is node-join: one more node (id n<N+1>, the same id at each
// join: a node coming back), with its own daprd and ways to Redis and
// Temporal, started and given up to up to be placed some of topics (its
// daprd subscribed to them); then it is stopped as an orchestrator stops a
// container (SIGTERM to the node, its grace, then its daprd), and the
// fault waits (up to 30 s) until the record no longer places anything on
// it. It returns the node's id and a note of what it served.
func (c *cluster) joinNode(ctx context.Context, topics []string, up time.Duration) (string, string, error) {
	c.mu.Lock()
	id := fmt.Sprintf("n%d", len(c.nodes)+1)
	c.mu.Unlock()
	n, err := c.newNode(ctx, id)
	if err != nil {
		return id, "", err
	}
	c.mu.Lock()
	c.joined = append(c.joined, n)
	c.mu.Unlock()
	began := time.Now()
	if err := c.startNode(ctx, n); err != nil {
		c.leave(n)
		return id, "", fmt.Errorf("starting node %s: %w", id, err)
	}
	ready := time.Since(began)
	took, rec, ok := c.waitPlacement(ctx, up, func(rec placement.Record) bool {
		mine := served(rec, id, topics)
		if len(mine) == 0 {
			return false
		}
		subs, err := c.subscribed(n)
		if err != nil {
			return false
		}
		for _, t := range mine {
			if !subs[t] {
				return false
			}
		}
		return true
	})
	note := fmt.Sprintf("ready in %s; ", ready.Round(100*time.Millisecond))
	if ok {
		note += fmt.Sprintf("given %v (subscribed) %s after ready: %s", served(rec, id, topics), took.Round(100*time.Millisecond), placedLine(rec, topics))
	} else {
		note += fmt.Sprintf("given none of the topics within %s: %s", up, placedLine(rec, topics))
	}
	sleepCtx(ctx, time.Until(began.Add(ready+up)))
	stopBegan := time.Now()
	c.leave(n)
	stopped := time.Since(stopBegan)
	took, rec, ok = c.waitPlacement(ctx, 30*time.Second, func(rec placement.Record) bool { return len(served(rec, id, topics)) == 0 })
	if ok {
		note += fmt.Sprintf("; stopped (SIGTERM) in %s, its topics placed elsewhere %s later: %s", stopped.Round(100*time.Millisecond), took.Round(100*time.Millisecond), placedLine(rec, topics))
	} else {
		note += fmt.Sprintf("; stopped (SIGTERM) in %s, still placed on it 30 s later: %s", stopped.Round(100*time.Millisecond), placedLine(rec, topics))
	}
	return id, note, nil
}

// leave stops joined node n (SIGTERM to the node, its grace, then its
// daprd) and closes its proxies.
func (c *cluster) leave(n *node) {
	c.mu.Lock()
	p, d := n.proc, n.daprd
	c.mu.Unlock()
	if p != nil {
		p.Terminate(20 * time.Second)
		p.Kill() // the rest of its process group
	}
	if d != nil {
		d.Stop(5 * time.Second)
	}
	n.redis.close()
	n.temporal.close()
	c.mu.Lock()
	c.joined = slices.DeleteFunc(c.joined, func(x *node) bool { return x == n })
	c.mu.Unlock()
}

// watchKilled waits down while node id is dead (kill9-node) and says what
// placement did meanwhile: the topics it served at the kill, and whether
// (and when) each was placed on other live nodes, min(replicas, the
// others) of them, once its heartbeats stopped.
func (c *cluster) watchKilled(ctx context.Context, id string, topics []string, down time.Duration) string {
	began := time.Now()
	rec0, err := readPlacement(c.stack.RedisAddr)
	if err != nil {
		sleepCtx(ctx, down)
		return "placement unknown: " + err.Error()
	}
	had := served(rec0, id, topics)
	c.mu.Lock()
	others := len(c.nodes) - 1
	c.mu.Unlock()
	want := min(placementReplicas, others)
	var took time.Duration
	var rec placement.Record
	ok := false
	if len(had) > 0 {
		took, rec, ok = c.waitPlacement(ctx, down, func(rec placement.Record) bool {
			for _, t := range had {
				tp := rec.Topics[t]
				if slices.Contains(tp.Serving(), id) || len(tp.Nodes) < want {
					return false
				}
			}
			return true
		})
	}
	sleepCtx(ctx, time.Until(began.Add(down)))
	sort.Strings(had)
	switch {
	case len(had) == 0:
		return "served none of the topics at the kill"
	case ok:
		return fmt.Sprintf("served %v at the kill; placed on %d other nodes %s after it: %s", had, want, took.Round(100*time.Millisecond), placedLine(rec, topics))
	default:
		return fmt.Sprintf("served %v at the kill; not placed elsewhere while down (%s; the bound: 3 heartbeats and a placement interval)", had, down)
	}
}

// TestPlacementCheckCatchesViolations proves that the checker's placement
// rule can fail: a converged placement passes, and each way of not being
// served by the replicas after convergence is caught.
func TestPlacementCheckCatchesViolations(t *testing.T) {
	both := placement.NodeInfo{Engines: []string{"python", "native"}}
	converged := func() placementInput {
		return placementInput{
			rec: placement.Record{Revision: 7, Topics: map[string]placement.TopicPlacement{
				"t1": {Nodes: []string{"n1", "n2"}, Replicas: placementReplicas},
				"t2": {Nodes: []string{"n2", "n3"}, Replicas: placementReplicas},
				"t3": {}, // no running worker: not judged
			}},
			live:    []string{"n1", "n2", "n3"},
			infos:   map[string]placement.NodeInfo{"n1": both, "n2": both, "n3": both},
			subs:    map[string]map[string]bool{"n1": {"t1": true}, "n2": {"t1": true, "t2": true}, "n3": {"t2": true}},
			engines: map[string]map[string]bool{"t1": {"python": true, "native": true}, "t2": {"python": true}},
			running: map[string][]string{"t1": {"w1", "w2"}, "t2": {"w3"}},
		}
	}
	topics := []string{"t1", "t2", "t3"}
	if d := placementCheck(converged(), topics); d != "" {
		t.Fatalf("a converged placement diverges: %s", d)
	}
	cases := []struct {
		name, want string
		change     func(*placementInput)
	}{
		{"unplaced", "not in the placement record", func(in *placementInput) { delete(in.rec.Topics, "t1") }},
		{"one replica of three nodes", "placed on 1 nodes", func(in *placementInput) {
			in.rec.Topics["t1"] = placement.TopicPlacement{Nodes: []string{"n1"}}
			in.subs["n2"]["t1"] = false
		}},
		{"all three nodes", "placed on 3 nodes", func(in *placementInput) {
			in.rec.Topics["t2"] = placement.TopicPlacement{Nodes: []string{"n1", "n2", "n3"}}
			in.subs["n1"]["t2"] = true
		}},
		{"a move under way", "a move under way", func(in *placementInput) {
			in.rec.Topics["t1"] = placement.TopicPlacement{Nodes: []string{"n1", "n2"}, Leaving: []string{"n3"}}
		}},
		{"on a dead node", "not a live undrained node", func(in *placementInput) {
			in.live = []string{"n1", "n2"}
			delete(in.subs, "n3")
			in.rec.Topics["t2"] = placement.TopicPlacement{Nodes: []string{"n2", "n3"}}
		}},
		{"on a drained node", "not a live undrained node", func(in *placementInput) { in.rec.Drained = []string{"n1"} }},
		{"on a node that cannot run it", "not a live undrained node", func(in *placementInput) {
			in.infos["n1"] = placement.NodeInfo{Engines: []string{"python"}}
		}},
		{"a placed node not subscribed", "daprd of n1 subscribed false, placed there true", func(in *placementInput) { in.subs["n1"]["t1"] = false }},
		{"another node subscribed", "daprd of n3 subscribed true, placed there false", func(in *placementInput) { in.subs["n3"]["t1"] = true }},
		{"a running worker unplaceable", "reported unplaceable", func(in *placementInput) {
			in.rec.Topics["t2"] = placement.TopicPlacement{Nodes: []string{"n2", "n3"}, Unplaceable: map[string]string{"w3": "no node"}}
		}},
	}
	for _, tc := range cases {
		in := converged()
		tc.change(&in)
		if d := placementCheck(in, topics); !strings.Contains(d, tc.want) {
			t.Errorf("%s: divergence %q, want it to say %q", tc.name, d, tc.want)
		}
	}
	// Fewer eligible nodes than replicas: the topic is served by all of them.
	in := converged()
	in.rec.Drained = []string{"n3"}
	in.subs["n3"]["t2"] = false
	in.rec.Topics["t2"] = placement.TopicPlacement{Nodes: []string{"n1", "n2"}}
	in.subs["n1"]["t2"] = true
	if d := placementCheck(in, topics); d != "" {
		t.Fatalf("n3 drained, t2 moved to n1 and n2: diverges: %s", d)
	}
	in.live = []string{"n2", "n3"}
	delete(in.subs, "n1")
	in.rec.Topics["t1"] = placement.TopicPlacement{Nodes: []string{"n2"}}
	in.rec.Topics["t2"] = placement.TopicPlacement{Nodes: []string{"n2"}}
	if d := placementCheck(in, topics); d != "" {
		t.Fatalf("n1 dead and n3 drained, everything on n2 (the one eligible node): diverges: %s", d)
	}
}
