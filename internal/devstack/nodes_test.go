package devstack

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// Issue 45 item 6: -nodes N -node-labels "a;b;c" plans N nodes, the first
// as `make run` has always run it, the others named node-2, node-3, each
// with its own log, daprd log, state directory and labels.
func TestDevNodesNamesAndLabels(t *testing.T) {
	nodes, err := DevNodes(3, " zone=a ; zone=b, pool=cpu ;")
	if err != nil {
		t.Fatal(err)
	}
	type row struct{ id, log, sidecar, name, state, labels string }
	var got []row
	for _, n := range nodes {
		got = append(got, row{n.ID(), n.LogName(), n.SidecarName(), n.Name(), n.StateDir("/d"), n.Labels})
	}
	want := []row{
		{"local", "node", "daprd", "worker node", "/d/node-state", "zone=a"},
		{"node-2", "node-2", "daprd-2", "worker node node-2", "/d/node-state-2", "zone=b,pool=cpu"},
		{"node-3", "node-3", "daprd-3", "worker node node-3", "/d/node-state-3", ""},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}

	one, err := DevNodes(1, "")
	if err != nil || len(one) != 1 || one[0].Labels != "" {
		t.Fatalf("default: %v %v", one, err)
	}
	// The first node's environment is NodeEnv's, unchanged, without labels.
	if env := one[0].Env(func(string) string { return "" }); !reflect.DeepEqual(env, NodeEnv(func(string) string { return "" })) {
		t.Fatalf("first node's env %v differs from NodeEnv", env)
	}

	for _, bad := range []struct {
		n      int
		labels string
		says   string
	}{
		{0, "", "-nodes must be at least 1"},
		{2, "zone=a;zone=b;zone=c", "lists 3 nodes' labels"},
		{2, "zone=a;zone", `label "zone" is not key=value`},
		{1, "=a", "not key=value"},
	} {
		if _, err := DevNodes(bad.n, bad.labels); err == nil || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("DevNodes(%d, %q) = %v, want an error saying %q", bad.n, bad.labels, err, bad.says)
		}
	}
}

// A further node runs on its own daprd, with its own id, state directory,
// log and labels: what the started process sees (env(1) as the node
// binary prints its environment, later duplicates already dropped).
func TestStartDevNodeEnvironment(t *testing.T) {
	dir := t.TempDir()
	s := &Stack{Options: Options{Dir: dir}, DaprGRPCAddr: "127.0.0.1:50001", TemporalAddr: "127.0.0.1:7233", RedisAddr: "127.0.0.1:6380"}
	getenv := func(string) string { return "" }
	seen := func(n DevNode, dapr string) map[string]string {
		t.Helper()
		p, err := s.StartDevNode("/usr/bin/env", "127.0.0.1:9999", n, dapr, getenv, "EXTRA=1")
		if err != nil {
			t.Fatal(err)
		}
		<-p.Done()
		if p.Log != filepath.Join(dir, n.LogName()+".log") {
			t.Fatalf("log %s, want %s.log", p.Log, n.LogName())
		}
		vars := map[string]string{}
		for _, line := range strings.Split(p.Output(), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				vars[k] = v
			}
		}
		return vars
	}
	check := func(vars map[string]string, want map[string]string) {
		t.Helper()
		for k, v := range want {
			if vars[k] != v {
				t.Errorf("%s=%q, want %q", k, vars[k], v)
			}
		}
	}
	first := seen(DevNode{N: 1}, s.DaprGRPCAddr)
	check(first, map[string]string{"WORKMANAGER_NODE_ID": "local", "DAPR_GRPC_ADDRESS": "127.0.0.1:50001",
		"NODE_STATE_DIR": filepath.Join(dir, "node-state"), "WORKMANAGER_HTTP_ADDR": "127.0.0.1:9999", "EXTRA": "1"})
	if _, ok := first["NODE_LABELS"]; ok {
		t.Errorf("the first node without labels got NODE_LABELS=%q", first["NODE_LABELS"])
	}
	second := seen(DevNode{N: 2, Labels: "zone=b"}, "127.0.0.1:40002")
	check(second, map[string]string{"WORKMANAGER_NODE_ID": "node-2", "DAPR_GRPC_ADDRESS": "127.0.0.1:40002",
		"NODE_STATE_DIR": filepath.Join(dir, "node-state-2"), "NODE_LABELS": "zone=b", "EXTRA": "1"})
}
