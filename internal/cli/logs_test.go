package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

const nodeLogLines = `time=t1 level=INFO msg="worker line one" worker_id=w-1 stream=stderr
time=t2 level=INFO msg="another worker" worker_id=w-10 stream=stderr
time=t3 level=WARN msg="worker attempt failed" worker_id=w-1 topic=orders
time=t4 level=INFO msg="node started"
time=t5 level=INFO msg="ends with it" worker_id=w-1
`

// TestLogsPrintsTheWorkersLines (issue 44 item 4): 'wmctl logs NAME'
// resolves the name through the API and prints that worker's lines of the
// node's log (.run/node.log), not a grep hint and exit 1.
func TestLogsPrintsTheWorkersLines(t *testing.T) {
	f := startFake(t, nil)
	f.add(&pb.Worker{WorkerId: "w-1", Name: "pricer", Topic: "orders"})
	f.add(&pb.Worker{WorkerId: "w-10", Topic: "orders"})
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, ".run"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, NodeLogFile), []byte(nodeLogLines), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"WMCTL_ADDR": f.addr, "WMCTL_TOKEN": goodToken}
	r := run(t, env, dir, "logs", "pricer")
	want := "time=t1 level=INFO msg=\"worker line one\" worker_id=w-1 stream=stderr\n" +
		"time=t3 level=WARN msg=\"worker attempt failed\" worker_id=w-1 topic=orders\n" +
		"time=t5 level=INFO msg=\"ends with it\" worker_id=w-1\n"
	if r.code != 0 || r.out != want {
		t.Errorf("logs pricer: exit %d, stderr %q, out:\n%s\nwant:\n%s", r.code, r.err, r.out, want)
	}
	if r := run(t, env, dir, "logs", "nope"); r.code != 3 {
		t.Errorf("logs of an unknown name: exit %d %q, want 3", r.code, r.err)
	}
	if r := run(t, env, t.TempDir(), "logs", "pricer"); r.code != 2 || !strings.Contains(r.err, "--file") {
		t.Errorf("logs without a node log: exit %d %q, want 2 and a hint at --file", r.code, r.err)
	}
	other := filepath.Join(t.TempDir(), "n.log")
	if err := os.WriteFile(other, []byte(nodeLogLines), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := run(t, env, "", "logs", "w-10", "--file", other); r.code != 0 || !strings.HasPrefix(r.out, "time=t2") || strings.Count(r.out, "\n") != 1 {
		t.Errorf("logs w-10 --file: exit %d %q out %q", r.code, r.err, r.out)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLogsFollow: --follow prints the lines written after it started, a
// line written in two pieces once, until interrupted.
func TestLogsFollow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.log")
	if err := os.WriteFile(path, []byte(nodeLogLines), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- followLog(ctx, r, "w-1", true, &out) }()
	waitFor := func(s string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(out.String(), s) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q within 10 s:\n%s", s, out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("t5")
	if _, err := w.WriteString("time=t6 level=INFO msg=late worker_"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * logPollInterval) // the half line is read and held
	if _, err := w.WriteString("id=w-1 stream=stdout\ntime=t7 msg=x worker_id=w-2\n"); err != nil {
		t.Fatal(err)
	}
	waitFor("t6")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := out.String(); strings.Count(got, "\n") != 4 || strings.Contains(got, "t7") || !strings.HasSuffix(got, "worker_id=w-1 stream=stdout\n") {
		t.Errorf("followed:\n%s", got)
	}
}
