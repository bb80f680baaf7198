package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Issue 32 items 2 and 3 on the real stack, as a new user's worker would
// try them (the node in the strict sandbox, PYTHON_ALLOWED_PACKAGES=os: no
// subprocess capability): starting /bin/sh through subprocess._fork_exec,
// reached through asyncio's globals (the module attribute
// asyncio.base_events.subprocess is hidden since issue 42), is refused, the runner carries
// the process lockdown filter, and /tmp and /scratch end with ENOSPC at
// their 64 MiB instead of taking the node's memory and disk.
func TestContainmentSandboxOnTheRealStack(t *testing.T) {
	inTurn(t) // functional, no timing assertions: runs next to the other parallel tests after the serial ones
	e := newEnvWith(t, envConfig{nodeEnv: []string{"WORKER_MAX_ATTEMPTS=1"}})
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := collectFrom(e.subscribe(out))
	e.createWith(t, &pb.CreateWorkerRequest{Topic: in, Code: pyCode([]byte(fmt.Sprintf(`
import asyncio

def attempt(kind):
    if kind == "fork-exec":
        be = asyncio.base_events.BaseEventLoop.__init__.__globals__
        os_ = be["os"]
        r, w = os_.pipe()
        pid = be["subprocess"]._fork_exec([b"/bin/sh", b"-c", b"echo pwned"], [b"/bin/sh"], True, (w,), None, None,
            -1, -1, -1, w, -1, -1, -1, -1, True, False, -1, None, None, None, -1, None, False)
        os_.close(w)
        return os_.read(r, 100).decode()
    if kind == "filters":
        return [l for l in open("/proc/self/status").read().splitlines() if l.startswith("Seccomp")]
    if kind in ("fill-tmp", "fill-scratch"):
        d = "/tmp" if kind == "fill-tmp" else "/scratch"
        n = 0
        chunk = b"x" * (1 << 20)
        try:
            while n < (1 << 30):
                with open("%%s/fill%%d" %% (d, n >> 23), "wb") as f:
                    for _ in range(8):
                        f.write(chunk)
                        n += len(chunk)
        except OSError as e:
            return "stopped after %%d MiB: %%s" %% (n >> 20, e)
        return "wrote %%d MiB" %% (n >> 20)
    return "?"

def process(event):
    kind = event["data"]["kind"]
    try:
        r = repr(attempt(kind))
    except BaseException as e:
        r = "%%s: %%s" %% (type(e).__name__, e)
    return {"type": %q, "data": {"kind": kind, "result": r}}
`, out)))})
	kinds := []string{"fork-exec", "filters", "fill-tmp", "fill-scratch"}
	for _, k := range kinds {
		e.publish(in, "m-"+k, map[string]any{"kind": k}, "")
	}
	results := map[string]string{}
	waitFor(t, 2*time.Minute, "the worker's answers", func() bool {
		for _, ev := range outs.all() {
			var d struct{ Kind, Result string }
			_ = json.Unmarshal(ev.Data(), &d)
			results[d.Kind] = d.Result
		}
		return len(results) >= len(kinds)
	})
	for kind, want := range map[string]string{
		"fork-exec":    "starting processes or sending signals is not allowed",
		"filters":      `Seccomp_filters:\t2`,
		"fill-tmp":     "No space left on device",
		"fill-scratch": "No space left on device",
	} {
		if !strings.Contains(results[kind], want) {
			t.Errorf("%s: %q, want it to contain %q", kind, results[kind], want)
		}
	}
	for _, kind := range []string{"fill-tmp", "fill-scratch"} {
		var mib int
		if _, err := fmt.Sscanf(results[kind], "'stopped after %d MiB", &mib); err != nil || mib > 64 {
			t.Errorf("%s: %q; want a stop at 64 MiB at most", kind, results[kind])
		}
	}
}
