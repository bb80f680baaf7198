package python_test

import (
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines/python"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
)

// fdWriter is a worker that looks for the node's sockets: it writes to
// every descriptor of its process that is a socket.
const fdWriter = `
import os

async def process(event):
    hit = []
    for name in os.listdir('/proc/self/fd'):
        fd = int(name)
        try:
            target = os.readlink('/proc/self/fd/' + name)
        except OSError:
            continue
        if fd > 2 and target.startswith('socket:'):
            try:
                os.write(fd, b'LEAKED')
                hit.append(fd)
            except OSError:
                pass
    return {"type": "fds", "data": {"written": hit}}
`

// Issue 42 item 1: a socket and a file the node holds without
// close-on-exec reach no Python runner (strict sandbox): no runner process
// holds them, and the worker's writes to every socket it has reach nothing
// of the node's.
// Both ways a runner starts: forked from the fork server (which, with its
// supervisors, holds none of them either) and through the chain.
func TestNodeDescriptorsDoNotReachPythonWorkers(t *testing.T) {
	bothWays(t, func(t *testing.T, noFork bool) {
		leak := sandboxtest.NodeDescriptors(t)
		e := newEngine(t, python.Config{Sandbox: sandboxtest.Strict(t), AllowedPackages: []string{"os"}, DefaultTimeout: 20 * time.Second, NoForkServer: noFork})
		inst := load(t, e, testSpec, fdWriter)
		out := mustCall(t, inst, jsonEvent("probe", nil))
		if len(out) != 1 {
			t.Fatalf("outputs %v", out)
		}
		t.Logf("the worker wrote to sockets %s", out[0].Data())
		leak.Check(t)
	})
}
