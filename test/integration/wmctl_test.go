package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/devstack"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/testsink"
)

// wmctlRun runs the built wmctl binary against one env.
type wmctlRun struct {
	t   *testing.T
	bin string
	env []string // the whole environment of every run
	dir string   // working directory
}

// newWmctl points wmctl at e's API and daprd through the environment, with
// a config home of its own (no user config applies).
func newWmctl(t *testing.T, e *env) *wmctlRun {
	home := t.TempDir()
	base := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "XDG_CONFIG_HOME=" + home,
		"WMCTL_ADDR=" + e.apiAddr, "WMCTL_TOKEN_FILE=" + filepath.Join(e.stack.Dir, "dev-token"),
		"DAPR_GRPC_ADDRESS=" + e.stack.DaprGRPCAddr}
	return &wmctlRun{t: t, bin: filepath.Join(buildBinaries(t), "wmctl"), env: base, dir: t.TempDir()}
}

// with is r with more environment (later entries win) or another directory.
func (r *wmctlRun) with(dir string, env ...string) *wmctlRun {
	c := *r
	if dir != "" {
		c.dir = dir
	}
	c.env = append(append([]string(nil), r.env...), env...)
	return &c
}

// without is r without the environment variables named.
func (r *wmctlRun) without(names ...string) *wmctlRun {
	c := *r
	c.env = nil
	for _, kv := range r.env {
		keep := true
		for _, n := range names {
			if strings.HasPrefix(kv, n+"=") {
				keep = false
			}
		}
		if keep {
			c.env = append(c.env, kv)
		}
	}
	return &c
}

func (r *wmctlRun) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, r.bin, args...)
	cmd.Env, cmd.Dir = r.env, r.dir
	return cmd
}

// run runs wmctl to its end (at most 4 minutes) and returns its stdout,
// stderr and exit code.
func (r *wmctlRun) run(args ...string) (string, string, int) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := r.command(ctx, args...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok || ctx.Err() != nil {
			r.t.Fatalf("wmctl %v: %v (stderr %q)", args, err, errb.String())
		}
		code = ee.ExitCode()
	}
	return out.String(), errb.String(), code
}

// ok runs wmctl and wants exit 0.
func (r *wmctlRun) ok(args ...string) string {
	r.t.Helper()
	out, errs, code := r.run(args...)
	if code != 0 {
		r.t.Fatalf("wmctl %v: exit %d, stderr %q", args, code, errs)
	}
	return out
}

// json runs wmctl with -o json and decodes its output into v.
func (r *wmctlRun) json(v any, args ...string) {
	r.t.Helper()
	out := r.ok(append(args, "-o", "json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		r.t.Fatalf("wmctl %v -o json: %v\n%s", args, err, out)
	}
}

// fails runs wmctl, wants exit code and stderr containing msg.
func (r *wmctlRun) fails(code int, msg string, args ...string) {
	r.t.Helper()
	_, errs, got := r.run(args...)
	if got != code || !strings.Contains(errs, msg) || !strings.HasPrefix(errs, "wmctl: ") {
		r.t.Errorf("wmctl %v: exit %d, stderr %q; want exit %d and %q", args, got, errs, code, msg)
	}
}

// wmWorker is a worker as wmctl -o json prints it.
type wmWorker struct {
	WorkerID    string `json:"workerId"`
	Name        string `json:"name"`
	Topic       string `json:"topic"`
	MimeType    string `json:"mimeType"`
	Status      string `json:"status"`
	CodeVersion string `json:"codeVersion"` // int64: a string in protojson
	RetryPolicy struct {
		MaxAttempts int    `json:"maxAttempts"`
		BackoffMs   string `json:"backoffMs"`
	} `json:"retryPolicy"`
	AllowedOutputTopics []string `json:"allowedOutputTopics"`
}

type wmHistoryEntry struct {
	Version    string `json:"version"`
	Action     string `json:"action"`
	RollbackTo string `json:"rollbackTo"`
}

type wmDeadLetter struct {
	EventID  string `json:"eventId"`
	Reason   string `json:"reason"`
	Attempts int    `json:"attempts"`
	Error    string `json:"error"`
}

// lineCollector gathers the lines a background process prints.
type lineCollector struct {
	mu    sync.Mutex
	lines []string
}

func (c *lineCollector) all() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.lines...)
}

// waitSubscribedVia waits until the daprd at httpAddr holds a subscription
// to topic.
func waitSubscribedVia(t *testing.T, httpAddr, topic string) {
	t.Helper()
	waitFor(t, 30*time.Second, "a subscription to "+topic+" on daprd "+httpAddr, func() bool {
		subscribed, err := daprSubscribed(httpAddr, "", topic)
		return err == nil && subscribed
	})
}

// TestWmctl drives every wmctl command, as a subprocess, against the real
// stack: create (Python and C#), list/get/history, start/stop, publish,
// events --follow, dead letters and their replay, reload, rollback, recover,
// delete, completion, the credential lookups, and the exit codes of the bad
// paths.
func TestWmctl(t *testing.T) {
	inTurn(t) // functional, no timing assertions: runs next to the other parallel tests after the serial ones
	e := newEnv(t, "")
	w := newWmctl(t, e)
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := e.subscribe(out)
	dir := t.TempDir()
	write := func(name string, content []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, content, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	v1 := write("worker.py", echoWorker(out, "v1")) // raises on {"fail": true}
	v2 := write("fixed.py", []byte(fmt.Sprintf(`
def process(event):
    return {"type": %q, "data": {"version": "v2", "input": event.get("data"), "seen_correlationid": event.get("correlationid")}}
`, out)))

	// create: the MIME type from the file name; the id is printed.
	id := strings.TrimSpace(w.ok("create", v1, "--topic", in, "--name", "wmctl-py", "--max-attempts", "2", "--backoff", "100ms",
		"--allowed-output-topics", out))
	if len(id) != 36 {
		t.Fatalf("create printed %q, want a worker id", id)
	}
	var got wmWorker
	w.json(&got, "get", "wmctl-py")
	if got.WorkerID != id || got.Name != "wmctl-py" || got.Topic != in || got.MimeType != "text/x-python" || got.Status != "WORKER_STATUS_RUNNING" ||
		got.CodeVersion != "1" || got.RetryPolicy.MaxAttempts != 2 || got.RetryPolicy.BackoffMs != "100" || strings.Join(got.AllowedOutputTopics, ",") != out {
		t.Fatalf("get -o json: %+v", got)
	}
	csIn := topicName(t, "cs")
	csID := strings.TrimSpace(w.ok("create", write("Echo.cs", csharpWorker(out, "cs")), "--topic", csIn, "--timeout", "3m"))
	var ws []wmWorker
	w.json(&ws, "list")
	found := map[string]wmWorker{}
	for _, x := range ws {
		found[x.WorkerID] = x
	}
	if len(ws) != 2 || found[id].Name != "wmctl-py" || found[csID].MimeType != "text/x-csharp" || found[csID].Status != "WORKER_STATUS_RUNNING" {
		t.Fatalf("list -o json: %+v", ws)
	}
	if table := w.ok("list"); !strings.Contains(table, "wmctl-py") || !strings.Contains(table, "RUNNING") || !strings.HasPrefix(table, "ID ") {
		t.Errorf("list:\n%s", table)
	}

	// events --follow, through a daprd of its own app id (the env's daprd
	// already holds the lifecycle subscription of the test harness, and a
	// daprd takes one per topic).
	side, err := e.stack.StartAppSidecar(ctxT(t), "daprd-wmctl", "wmctl-events", 0)
	if err != nil {
		t.Fatal(err)
	}
	evCtx, evCancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer evCancel()
	events := w.command(evCtx, "events", "--follow", "--dapr", side.GRPCAddr, "--worker", "wmctl-py", "-o", "json")
	var evErr testsink.Buffer
	events.Stderr = &evErr
	stdout, err := events.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := events.Start(); err != nil {
		t.Fatal(err)
	}
	lines := &lineCollector{}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines.mu.Lock()
			lines.lines = append(lines.lines, sc.Text())
			lines.mu.Unlock()
		}
	}()
	waitSubscribedVia(t, side.HTTPAddr, lifecycleevents.Topic)
	if s := w.ok("stop", "wmctl-py"); !strings.Contains(s, "STOPPED") {
		t.Errorf("stop:\n%s", s)
	}
	var started wmWorker
	w.json(&started, "start", id)
	if started.Status != "WORKER_STATUS_RUNNING" {
		t.Errorf("start -o json: %+v", started)
	}
	type evLine struct {
		Type string               `json:"type"`
		Time string               `json:"time"`
		Data lifecycleevents.Data `json:"data"`
	}
	seen := func(kind lifecycleevents.Kind) bool {
		for _, l := range lines.all() {
			var ev evLine
			if json.Unmarshal([]byte(l), &ev) == nil && ev.Type == lifecycleevents.TypePrefix+string(kind) && ev.Data.WorkerID == id {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(60 * time.Second); !seen(lifecycleevents.Stopped) || !seen(lifecycleevents.Started); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for the stopped and started lines of worker %s from wmctl events; it printed %q, on stderr %q", id, lines.all(), evErr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = events.Process.Signal(syscall.SIGINT)
	select {
	case <-readDone:
	case <-time.After(15 * time.Second):
		t.Fatal("wmctl events did not end within 15s of SIGINT")
	}
	if err := events.Wait(); err != nil {
		t.Errorf("wmctl events after SIGINT: %v (stderr %q)", err, evErr.String())
	}
	for _, l := range lines.all() {
		var ev evLine
		if err := json.Unmarshal([]byte(l), &ev); err != nil || ev.Data.WorkerID != id || ev.Time == "" {
			t.Errorf("events line %q (want only worker %s's, as JSON with a time)", l, id)
		}
	}

	// publish: a structured CloudEvent, so the worker sees its id and
	// correlation id.
	if printed := strings.TrimSpace(w.ok("publish", in, "--type", "test.input", "--id", "p-1", "--data", `{"n":1}`, "--correlation-id", "c-1")); printed != "p-1" {
		t.Errorf("publish printed %q", printed)
	}
	ev := expectEvent(t, outs, 60*time.Second)
	if d := decodeOut(t, ev.Data()); d.Version != "v1" || d.Input["n"] != float64(1) || d.SeenCorrelationID == nil || *d.SeenCorrelationID != "c-1" {
		t.Fatalf("output of the published event: %+v", d)
	}

	// A message the worker raises on is dead-lettered after its 2 attempts.
	w.ok("publish", in, "--type", "test.input", "--id", "bad-1", "--data", `{"fail":true}`)
	var dead []wmDeadLetter
	waitFor(t, 90*time.Second, "the dead letter of bad-1 in wmctl dead", func() bool {
		w.json(&dead, "dead", "wmctl-py")
		return len(dead) == 1
	})
	if d := dead[0]; d.EventID != "bad-1" || d.Reason != "worker_failed" || d.Attempts != 2 || !strings.Contains(d.Error, "asked to fail") {
		t.Fatalf("dead letter %+v", d)
	}
	if table := w.ok("dead-letters", id, "--reason", "worker_failed"); !strings.Contains(table, "bad-1") || !strings.Contains(table, "worker_failed") {
		t.Errorf("dead-letters:\n%s", table)
	}

	// reload the fixed code, then replay: the worker answers it with v2.
	var reloaded wmWorker
	w.json(&reloaded, "reload", "wmctl-py", v2)
	if reloaded.CodeVersion != "2" {
		t.Fatalf("reload -o json: %+v", reloaded)
	}
	var noneOnTopic struct {
		Replayed  int `json:"replayed"`
		Remaining int `json:"remaining"`
	}
	w.json(&noneOnTopic, "replay-dead", "--topic", in, "--event-id", "no-such-event")
	if noneOnTopic.Replayed != 0 || noneOnTopic.Remaining != 0 {
		t.Errorf("replay-dead of an unknown event id: %+v", noneOnTopic)
	}
	if s := w.ok("replay-dead", "wmctl-py"); s != "replayed 1, remaining 0\nbad-1\n" {
		t.Errorf("replay-dead printed %q", s)
	}
	ev = expectEvent(t, outs, 60*time.Second)
	if d := decodeOut(t, ev.Data()); d.Version != "v2" || d.Input["fail"] != true {
		t.Fatalf("output of the replayed dead letter: %+v", d)
	}
	w.json(&dead, "dead", id)
	if len(dead) != 0 {
		t.Errorf("dead letters after the replay: %+v", dead)
	}

	var hist []wmHistoryEntry
	w.json(&hist, "history", "wmctl-py")
	if len(hist) != 2 || hist[0].Version != "1" || hist[0].Action != "create" || hist[1].Version != "2" || hist[1].Action != "load_code" {
		t.Fatalf("history -o json: %+v", hist)
	}

	// rollback to version 1: a new version 3 with the code of 1.
	rbOut, rbErr, rbCode := w.run("rollback", "wmctl-py", "1", "-o", "json")
	var rolled wmWorker
	if rbCode != 0 || json.Unmarshal([]byte(rbOut), &rolled) != nil || rolled.CodeVersion != "3" {
		t.Fatalf("rollback: exit %d, stdout %q, stderr %q; want code version 3", rbCode, rbOut, rbErr)
	}
	w.json(&hist, "history", "wmctl-py")
	if len(hist) != 3 || hist[2].Version != "3" || hist[2].Action != "rollback" || hist[2].RollbackTo != "1" {
		t.Fatalf("history after the rollback: %+v", hist)
	}
	w.ok("publish", in, "--id", "p-2", "--data", `{"n":2}`)
	if d := decodeOut(t, expectEvent(t, outs, 60*time.Second).Data()); d.Version != "v1" || d.Input["n"] != float64(2) {
		t.Fatalf("output after the rollback: %+v", d)
	}
	w.fails(3, "", "rollback", "wmctl-py", "99")

	var rec struct {
		Recovered int `json:"recovered"`
		Failed    int `json:"failed"`
	}
	w.json(&rec, "recover")
	if rec.Failed != 0 || rec.Recovered < 2 {
		t.Errorf("recover -o json: %+v", rec)
	}

	// Credentials from a config file, and from .run/dev-token in the
	// working directory.
	tok, err := os.ReadFile(filepath.Join(e.stack.Dir, "dev-token"))
	if err != nil {
		t.Fatal(err)
	}
	cfgHome := t.TempDir()
	if err := os.MkdirAll(filepath.Join(cfgHome, "wmctl"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfgHome, "wmctl", "token"), tok, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfgHome, "wmctl", "config.yaml"), []byte("addr: "+e.apiAddr+"\ntoken_file: token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fromFile := w.without("WMCTL_ADDR", "WMCTL_TOKEN_FILE").with("", "XDG_CONFIG_HOME="+cfgHome)
	if s := fromFile.ok("get", id); !strings.Contains(s, "wmctl-py") {
		t.Errorf("get with the config file:\n%s", s)
	}
	repo := t.TempDir()
	if err := os.MkdirAll(filepath.Join(repo, ".run"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, ".run", "dev-token"), tok, 0o600); err != nil {
		t.Fatal(err)
	}
	if s := w.without("WMCTL_TOKEN_FILE").with(repo).ok("list"); !strings.Contains(s, id) {
		t.Errorf("list with .run/dev-token:\n%s", s)
	}

	// The bad paths and their exit codes.
	w.fails(3, "not found", "get", "no-such-worker")
	w.fails(3, "not found", "stop", "00000000-0000-4000-8000-000000000000")
	w.fails(4, "", "list", "--token", "wrong-token")
	w.without("WMCTL_TOKEN_FILE").fails(4, "", "list")
	w.fails(5, "SyntaxError", "create", write("broken.py", []byte("def process(:\n")), "--topic", in)
	w.fails(5, "", "create", v1, "--topic", in, "--mime", "text/x-nope")
	w.fails(5, "", "create", v1, "--topic", in, "--name", "wmctl-py")
	w.fails(2, "--mime", "create", write("worker.txt", []byte("x")), "--topic", in)
	w.fails(2, "", "get")
	port, err := devstack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	w.fails(6, "not reachable", "list", "--addr", "127.0.0.1:"+strconv.Itoa(port))
	w.fails(6, "not reachable", "publish", in, "--dapr", "127.0.0.1:"+strconv.Itoa(port))
	// logs (issue 44 item 4): the worker's lines of the node's log, found
	// by name, each naming the worker once; without a node log here, a
	// usage error that says where it is.
	w.fails(2, ".run/node.log", "logs", id)
	logs := w.ok("logs", "wmctl-py", "--file", filepath.Join(e.dir, "node.log"))
	if !strings.Contains(logs, "worker_id="+id) {
		t.Errorf("logs wmctl-py printed no line of %s:\n%s", id, logs)
	}
	for _, l := range strings.Split(strings.TrimSpace(logs), "\n") {
		if strings.Count(l, "worker_id=") != 1 || !strings.Contains(l, "worker_id="+id) {
			t.Errorf("logs wmctl-py: a line that is not the worker's once: %q", l)
		}
	}
	if s := w.ok("completion", "bash"); !strings.Contains(s, "bash completion") {
		t.Errorf("completion bash printed %d bytes", len(s))
	}

	// delete: gone afterwards.
	if s := w.ok("delete", "wmctl-py"); s != "deleted wmctl-py\n" {
		t.Errorf("delete printed %q", s)
	}
	w.ok("delete", csID, "-o", "json")
	w.fails(3, "not found", "get", id)
	w.json(&ws, "list")
	if len(ws) != 0 {
		t.Errorf("workers after delete: %+v", ws)
	}
}
