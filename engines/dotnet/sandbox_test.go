package dotnet

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
)

// TestSandboxContainsEscapes runs a C# worker that tries what a worker
// must not do, inside the real sandbox (strict: every layer) with the
// host's lockdown filter: each attempt is refused or contained, and the
// instance keeps serving.
func TestSandboxContainsEscapes(t *testing.T) {
	sb := sandboxtest.Strict(t)
	t.Setenv("WM_NODE_SECRET", "hunter2")
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte("node secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()

	e := newTestEngine(t, Config{Sandbox: sb, DefaultTimeout: 20 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec := engines.Spec{WorkerID: "escape", MIMEType: MIMESource, Topic: "t", Logger: testLogger(t)}
	inst, err := e.Load(ctx, spec, fixture(t, "escape"))
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(context.Background())

	attempt := func(kind string, arg any) (string, error) {
		out, err := inst.Process(ctx, enginetest.NewEvent("e-"+kind, "escape", map[string]any{"kind": kind, "arg": arg}, ""))
		if err != nil {
			return "", err
		}
		if len(out) != 1 {
			t.Fatalf("%s: %d outputs", kind, len(out))
		}
		var s string
		if err := out[0].DataAs(&s); err != nil {
			t.Fatal(err)
		}
		return s, nil
	}
	mustRefuse := func(kind string, arg any, want string) {
		t.Helper()
		got, err := attempt(kind, arg)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if !strings.HasPrefix(got, "refused: ") || !strings.Contains(got, want) {
			t.Errorf("%s = %q, want refused (%s)", kind, got, want)
		}
	}

	env, err := attempt("env", nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(env, "hunter2") || strings.Contains(env, "WM_NODE_SECRET") || !strings.Contains(env, "VIRTUFIN_WORKER_ID=escape") {
		t.Errorf("the worker's environment = %q, want the worker variables only", env)
	}
	mustRefuse("exec", nil, "")
	if got, err := attempt("thread-exec", nil); err != nil || !strings.Contains(got, "refused: Win32Exception") {
		t.Errorf("thread-exec = %q, %v; want refused", got, err)
	}
	mustRefuse("tcp", tcp.Addr().(*net.TCPAddr).Port, "SocketException")
	if got, err := attempt("tcp-nolockdown-check", nil); err != nil || !strings.HasPrefix(got, "ok: unknown kind") {
		t.Fatalf("the host stopped serving: %q, %v", got, err)
	}
	mustRefuse("read-file", secretFile, "")
	mustRefuse("write-outside", nil, "")

	// Environment.Exit ends the host: the call fails, the host is
	// restarted and the next call is served.
	_, err = attempt("exit", nil)
	if !errors.Is(err, engines.ErrWorkerFailed) || !strings.Contains(err.Error(), "exited during the call") {
		t.Fatalf("exit: err = %v, want ErrWorkerFailed (exited during the call)", err)
	}
	if got, err := attempt("env", nil); err != nil || !strings.HasPrefix(got, "ok: ") {
		t.Fatalf("after exit: %q, %v", got, err)
	}
}
