package devstack

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestFreePortCanBeBound(t *testing.T) {
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatalf("port %d from FreePort cannot be bound: %v", port, err)
	}
	l.Close()
}

// A server that panics on a taken port prints the reason first and a long
// stack after it; start-up must still be recognised as a port conflict and
// the error must still show the panic line.
func TestExitOnTakenPortIsErrPortInUse(t *testing.T) {
	dir := t.TempDir()
	script := `echo "earlier run: fine"; ` // a previous run's log must not count
	p0, err := StartProc(dir, "srv", nil, "/bin/sh", "-c", script)
	if err != nil {
		t.Fatal(err)
	}
	<-p0.Done()
	script = `echo "panic: listen tcp 127.0.0.1:1: bind: address already in use"; i=0; while [ $i -lt 300 ]; do echo "	frame $i /go/pkg/mod/x.go:123 +0x1a3"; i=$((i+1)); done; exit 2`
	p, err := StartProc(dir, "srv", nil, "/bin/sh", "-c", script)
	if err != nil {
		t.Fatal(err)
	}
	err = waitFor(context.Background(), p, 10*time.Second, func() error { return errors.New("not yet") })
	if !errors.Is(err, ErrPortInUse) {
		t.Fatalf("want ErrPortInUse, got %v", err)
	}
	if !strings.Contains(err.Error(), "panic: listen tcp") || strings.Contains(err.Error(), "earlier run") {
		t.Fatalf("error should show this run's panic line only:\n%v", err)
	}
}

func TestWithFreePortsRetriesOnlyPortConflicts(t *testing.T) {
	s := &Stack{}
	var port, calls int
	err := s.withFreePorts(context.Background(), func(context.Context) error {
		calls++
		if calls < 3 {
			return ErrPortInUse
		}
		return nil
	}, &port)
	if err != nil || calls != 3 || port == 0 {
		t.Fatalf("err=%v calls=%d port=%d", err, calls, port)
	}
	calls = 0
	other := errors.New("config broken")
	if err := s.withFreePorts(context.Background(), func(context.Context) error { calls++; return other }, &port); !errors.Is(err, other) || calls != 1 {
		t.Fatalf("a non-port error must not be retried: err=%v calls=%d", err, calls)
	}
}

// Issue 44 item 1 (first part): make run's node runs native workers in a
// sandboxed host process unless NATIVE_ISOLATION asks for in-process.
func TestNodeEnvIsolatesNativeWorkersByDefault(t *testing.T) {
	has := func(env []string, kv string) bool {
		for _, e := range env {
			if e == kv {
				return true
			}
		}
		return false
	}
	env := NodeEnv(func(string) string { return "" })
	if !has(env, "NATIVE_ISOLATION=process") || !has(env, "WORKMANAGER_NODE_ID=local") || !has(env, "WORKER_TIMEOUT=10s") {
		t.Fatalf("default: %v", env)
	}
	env = NodeEnv(func(k string) string {
		if k == "NATIVE_ISOLATION" {
			return "in-process"
		}
		return ""
	})
	for _, e := range env {
		if len(e) > 17 && e[:17] == "NATIVE_ISOLATION=" {
			t.Fatalf("the user's NATIVE_ISOLATION is overridden: %v", env)
		}
	}
}

// Issue 44 item 7: a port in use is named at once, with the flag that
// moves it; free ports pass.
func TestCheckPortsFreeNamesThePortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	free.Close()
	if err := CheckPortsFree([]Port{{Addr: freeAddr, What: "Redis", Flag: "-redis-port"}}); err != nil {
		t.Fatalf("a free port: %v", err)
	}
	err = CheckPortsFree([]Port{{Addr: freeAddr, What: "Redis", Flag: "-redis-port"}, {Addr: ln.Addr().String(), What: "the control API", Flag: "-api-addr"}})
	if err == nil || !strings.Contains(err.Error(), ln.Addr().String()+" (the control API) is already in use") || !strings.Contains(err.Error(), "-api-addr") {
		t.Fatalf("a port in use: %v", err)
	}
}
