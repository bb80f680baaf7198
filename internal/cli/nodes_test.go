package cli

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// create sends --replicas (a count, or all: 0) and --require; without
// them it sends neither (the cluster's defaults); a --replicas that is
// not a count is a usage error.
func TestCreateSendsPlacement(t *testing.T) {
	f := startFake(t, nil)
	py := write(t, t.TempDir()+"/worker.py", "def process(e): pass\n")
	f.runOK(t, "create", py, "--topic", "a", "--replicas", "3", "--require", "pool=gpu,zone=a")
	f.runOK(t, "create", py, "--topic", "b", "--replicas", "all")
	f.runOK(t, "create", py, "--topic", "c")
	r := run(t, map[string]string{"WMCTL_ADDR": f.addr, "WMCTL_TOKEN": goodToken}, "", "create", py, "--topic", "d", "--replicas", "many")
	if r.code != ExitUsage || !strings.Contains(r.err, `--replicas "many" must be a number of nodes (1..64) or 'all'`) {
		t.Errorf("--replicas many: exit %d, %q", r.code, r.err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.creates) != 3 {
		t.Fatalf("%d creates sent, want 3", len(f.creates))
	}
	if c := f.creates[0]; c.Replicas == nil || c.GetReplicas() != 3 || fmt.Sprint(c.GetPlacement().GetRequire()) != "map[pool:gpu zone:a]" {
		t.Errorf("create --replicas 3 --require sent %v", c)
	}
	if c := f.creates[1]; c.Replicas == nil || c.GetReplicas() != 0 || c.Placement != nil {
		t.Errorf("create --replicas all sent %v", c)
	}
	if c := f.creates[2]; c.Replicas != nil || c.Placement != nil {
		t.Errorf("create without placement sent %v", c)
	}
}

// get shows a worker's replicas, placement, nodes and, when set, why no
// node can run it.
func TestGetShowsPlacement(t *testing.T) {
	f := startFake(t, nil)
	f.add(&pb.Worker{WorkerId: "w-1", Topic: "orders", Replicas: proto.Int32(0), Placement: &pb.WorkerPlacement{Require: map[string]string{"zone": "a", "pool": "gpu"}},
		PlacementReason: "no live node has the label pool=gpu"})
	f.add(&pb.Worker{WorkerId: "w-2", Topic: "orders", Nodes: []string{"node-a", "node-b"}})
	d1, d2 := f.runOK(t, "get", "w-1"), f.runOK(t, "get", "w-2")
	for _, c := range []struct{ detail, want string }{
		{d1, "Replicas: all (every node that can run it)"},
		{d1, "Placement: require pool=gpu,zone=a"},
		{d1, "Nodes: none\nPlacement reason: no live node has the label pool=gpu"},
		{d2, "Replicas: cluster default"},
		{d2, "Placement: any node"},
		{d2, "Nodes: node-a, node-b\n"},
	} {
		if !strings.Contains(squeeze(c.detail), c.want) {
			t.Errorf("get lacks %q:\n%s", c.want, c.detail)
		}
	}
	if strings.Contains(d2, "Placement reason") {
		t.Errorf("get shows a placement reason of a placed worker:\n%s", d2)
	}
}

// squeeze collapses the runs of spaces the table aligns with.
func squeeze(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ")
	}
	return strings.Join(lines, "\n")
}

// nodes prints a table, or an array of nodes with -o json; drain and
// drain --undo send the node and answer it.
func TestNodesAndDrain(t *testing.T) {
	f := startFake(t, nil)
	f.nodes = []*pb.Node{
		{Id: "node-a", Alive: true, Labels: map[string]string{"zone": "a", "pool": "cpu"}, Engines: []string{"native", "python"},
			MemoryBytes: 8 << 30, Workers: 12, Topics: 5, PlacedTopics: []string{"orders"}},
		{Id: "node-b", Drained: true},
	}
	table := squeeze(f.runOK(t, "nodes"))
	want := "NODE ALIVE DRAINED LABELS ENGINES WORKERS TOPICS MEMORY\n" +
		"node-a yes no pool=cpu,zone=a native,python 12 5 8.0 GiB\n" +
		"node-b no yes - - 0 0 -\n"
	if table != want {
		t.Errorf("nodes table:\n%s\nwant:\n%s", table, want)
	}
	var ns []map[string]any
	if err := json.Unmarshal([]byte(f.runOK(t, "nodes", "-o", "json")), &ns); err != nil || len(ns) != 2 || ns[0]["id"] != "node-a" ||
		fmt.Sprint(ns[0]["placedTopics"]) != "[orders]" || ns[1]["drained"] != true {
		t.Errorf("nodes -o json: %v %v", ns, err)
	}
	if out := f.runOK(t, "nodes", "-o", "yaml"); !strings.Contains(out, "- id: node-a\n") {
		t.Errorf("nodes -o yaml:\n%s", out)
	}
	if out := f.runOK(t, "drain", "node-a"); !strings.HasPrefix(out, "drained node-a") {
		t.Errorf("drain: %q", out)
	}
	var resp map[string]map[string]any
	if err := json.Unmarshal([]byte(f.runOK(t, "drain", "--undo", "node-b", "-o", "json")), &resp); err != nil || resp["node"]["id"] != "node-b" || resp["node"]["drained"] != false {
		t.Errorf("drain --undo -o json: %v %v", resp, err)
	}
	r := run(t, map[string]string{"WMCTL_ADDR": f.addr, "WMCTL_TOKEN": goodToken}, "", "drain", "node-x")
	if r.code != ExitNotFound || !strings.Contains(r.err, "node node-x not found") {
		t.Errorf("drain node-x: exit %d, %q", r.code, r.err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if got := fmt.Sprintf("%d %s %v %s %v", len(f.drains), f.drains[0].GetNodeId(), f.drains[0].GetUndrain(), f.drains[1].GetNodeId(), f.drains[1].GetUndrain()); got != "3 node-a false node-b true" {
		t.Errorf("drain requests: %s", got)
	}
}

// create --event-timeout sends timeout_ms; a bad value is a usage error.
func TestCreateSendsEventTimeout(t *testing.T) {
	f := startFake(t, nil)
	py := write(t, t.TempDir()+"/worker.py", "def process(e): pass\n")
	f.runOK(t, "create", py, "--topic", "a", "--event-timeout", "2.5s")
	f.runOK(t, "create", py, "--topic", "b")
	r := run(t, map[string]string{"WMCTL_ADDR": f.addr, "WMCTL_TOKEN": goodToken}, "", "create", py, "--topic", "c", "--event-timeout", "-1s")
	if r.code != ExitUsage || !strings.Contains(r.err, "--event-timeout -1s") {
		t.Errorf("--event-timeout -1s: exit %d, %q", r.code, r.err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.creates) != 2 || f.creates[0].GetTimeoutMs() != 2500 || f.creates[1].TimeoutMs != nil {
		t.Fatalf("creates sent %v, want timeout_ms 2500 then unset", f.creates)
	}
}
