package dotnet

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/sandbox"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
)

// Issue 42 item 1: a socket and a file the node holds without
// close-on-exec reach no .NET host (strict sandbox): neither the compiler
// nor the host that serves the worker holds them, and nothing reaches the
// node's listener.
func TestNodeDescriptorsDoNotReachDotnetWorkers(t *testing.T) {
	sb := sandboxtest.Strict(t)
	leak := sandboxtest.NodeDescriptors(t)
	e := newTestEngine(t, Config{Sandbox: sb, DefaultTimeout: 20 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec := engines.Spec{WorkerID: "fdleak", MIMEType: MIMESource, Topic: "t", Logger: testLogger(t)}
	inst, err := e.Load(ctx, spec, fixture(t, "echo"))
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(context.Background())
	if _, err := inst.Process(ctx, enginetest.NewEvent("e-1", "echo", map[string]any{"x": 1}, "")); err != nil {
		t.Fatal(err)
	}
	leak.Check(t)
}

// Issue 42 items 2 and 8: without bubblewrap (SANDBOX=standard, the
// unprivileged Kubernetes overlay) a .NET host shares the node's network
// and IPC namespaces, so its own filter refuses what bubblewrap's would
// have and more: IP, netlink and vsock sockets, memfd and SysV shared
// memory (not counted by RLIMIT_AS). With every layer, the memory cgroup
// counts memfd and shared memory, and only exotic socket families are
// refused.
func TestDotnetHostFilterPerMode(t *testing.T) {
	strict := sandboxtest.Strict(t)
	noBwrap := sandboxtest.New(t, sandbox.Config{Mode: sandbox.Standard, Bwrap: "/nonexistent/bwrap", Log: testLogger(t)})
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	port := strconv.Itoa(tcp.Addr().(*net.TCPAddr).Port)
	for _, c := range []struct {
		name string
		sb   *sandbox.Sandbox
		want map[string]string // kind -> "ok" or "refused"
	}{
		{"strict", strict, map[string]string{"memfd": "ok", "shm": "ok", "netlink": "ok", "vsock": "refused", "tcp": "refused"}},
		{"standard without bubblewrap", noBwrap, map[string]string{"memfd": "refused", "shm": "refused", "netlink": "refused", "vsock": "refused", "tcp": "refused"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newTestEngine(t, Config{Sandbox: c.sb, DefaultTimeout: 20 * time.Second})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			inst, err := e.Load(ctx, engines.Spec{WorkerID: "filter", MIMEType: MIMESource, Topic: "t", Logger: testLogger(t)}, fixture(t, "escape"))
			if err != nil {
				t.Fatal(err)
			}
			defer inst.Close(context.Background())
			for _, kind := range []string{"memfd", "shm", "netlink", "vsock", "tcp"} {
				out, err := inst.Process(ctx, enginetest.NewEvent("e-"+kind, "escape", map[string]any{"kind": kind, "arg": port}, ""))
				if err != nil || len(out) != 1 {
					t.Fatalf("%s: %v %v", kind, out, err)
				}
				var got string
				if err := out[0].DataAs(&got); err != nil {
					t.Fatal(err)
				}
				if !strings.HasPrefix(got, c.want[kind]+":") {
					t.Errorf("%s = %q, want %s", kind, got, c.want[kind])
				}
			}
		})
	}
}
