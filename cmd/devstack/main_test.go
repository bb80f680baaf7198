package main

import (
	"strings"
	"testing"

	"github.com/virtufin/workmanager/internal/devstack"
)

// With one node the banner's node and daprd lines are the ones `make run`
// has always printed; with several, each node's addresses are listed.
func TestBannerNodeLines(t *testing.T) {
	one := []*node{{DevNode: devstack.DevNode{N: 1}, addr: "127.0.0.1:8080",
		sidecar: devstack.Sidecar{GRPCAddr: "127.0.0.1:50001", HTTPAddr: "127.0.0.1:3500"}}}
	if got, want := nodeLines(one, "/d", "bin/wmctl"), "  node health          http://127.0.0.1:8080/health   (/healthz, /readyz; Prometheus metrics at /metrics)\n"; got != want {
		t.Fatalf("one node:\n%q\nwant\n%q", got, want)
	}
	if got := daprLine(one); got != "  daprd gRPC / HTTP    127.0.0.1:50001 / 127.0.0.1:3500\n" {
		t.Fatalf("one node's daprd line: %q", got)
	}

	three := append(one,
		&node{DevNode: devstack.DevNode{N: 2, Labels: "zone=b"}, addr: "127.0.0.1:41000", sidecar: devstack.Sidecar{GRPCAddr: "127.0.0.1:41001", HTTPAddr: "127.0.0.1:41002"}},
		&node{DevNode: devstack.DevNode{N: 3}, addr: "127.0.0.1:42000", sidecar: devstack.Sidecar{GRPCAddr: "127.0.0.1:42001", HTTPAddr: "127.0.0.1:42002"}})
	if daprLine(three) != "" {
		t.Fatalf("several nodes: the single daprd line stays: %q", daprLine(three))
	}
	got := nodeLines(three, "/d", "bin/wmctl")
	for _, want := range []string{
		"3 worker nodes, Dapr app id workmanager (bin/wmctl nodes lists them)",
		"node local", "http://127.0.0.1:8080/health", "http://127.0.0.1:8080/metrics", "127.0.0.1:50001 / 127.0.0.1:3500", "/d/node-state ", "/d/node.log",
		"node node-2", "http://127.0.0.1:41000/health", "http://127.0.0.1:41000/metrics", "127.0.0.1:41001 / 127.0.0.1:41002", "/d/node-state-2", "/d/node-2.log", "labels zone=b",
		"node node-3", "http://127.0.0.1:42000/health", "127.0.0.1:42001 / 127.0.0.1:42002", "/d/node-3.log",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("banner lacks %q:\n%s", want, got)
		}
	}
	if strings.Count(got, "labels ") != 1 {
		t.Errorf("only node-2 has labels:\n%s", got)
	}
}
