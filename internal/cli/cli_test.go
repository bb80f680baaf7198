package cli

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"gopkg.in/yaml.v3"

	"github.com/virtufin/workmanager/internal/devstack"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

func zipOf(t *testing.T, files ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range files {
		w, err := zw.Create(f)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = w.Write([]byte("x"))
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestInferMIME(t *testing.T) {
	for _, c := range []struct {
		name    string
		content []byte
		want    string // "" : an error asking for --mime
	}{
		{"worker.py", nil, MIMEPython},
		{"dir/Worker.PY", nil, MIMEPython},
		{"Pricer.cs", nil, MIMECSharp},
		{"Worker.dll", nil, MIMEDotnet},
		{"Acme.Calc.1.0.0.nupkg", nil, MIMEDotnet},
		{"build/pricer.wasm", nil, MIMEWasm},
		{"echo.zip", zipOf(t, "manifest.json", "runtimes/linux-x64/native/libecho.so"), MIMENative},
		{"calc.zip", zipOf(t, "lib/net48/Acme.Calc.dll", "lib/net48/Dep.dll"), MIMEDotnet},
		{"calc.zip", zipOf(t, "lib/netstandard2.0/Acme.Calc.DLL"), MIMEDotnet},
		{"calc.zip", zipOf(t, "Acme.Calc.nuspec", "content/readme.txt"), MIMEDotnet},
		{"nested.zip", zipOf(t, "pkg/manifest.json", "pkg/libecho.so"), ""},
		{"flat.zip", zipOf(t, "Acme.Calc.dll"), ""},
		{"empty.zip", zipOf(t), ""},
		{"broken.zip", []byte("not a zip"), ""},
		{"worker.txt", nil, ""},
		{"worker", nil, ""},
	} {
		got, err := InferMIME(c.name, c.content)
		if c.want == "" {
			if err == nil || !strings.Contains(err.Error(), "--mime") {
				t.Errorf("%s: got %q, %v; want an error asking for --mime", c.name, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: got %q, %v; want %q", c.name, got, err, c.want)
		}
	}
	if got, err := InferMIMEFromURL("https://example.com/w/worker.py?x=1"); err != nil || got != MIMEPython {
		t.Errorf("URL .py: %q %v", got, err)
	}
	if _, err := InferMIMEFromURL("https://example.com/echo.zip"); err == nil || !strings.Contains(err.Error(), "--mime") {
		t.Errorf("URL .zip: %v, want an error asking for --mime", err)
	}
}

// config resolves the configuration of `wmctl <args>` with env and workDir.
func config(t *testing.T, env map[string]string, workDir string, args ...string) (Config, error) {
	t.Helper()
	a := &app{opts: Options{Getenv: func(k string) string { return env[k] }, WorkDir: workDir}}
	root := a.rootCommand()
	fs := root.PersistentFlags()
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	err := a.loadConfig(fs)
	return a.cfg, err
}

func write(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	xdg := filepath.Join(dir, "xdg")
	write(t, filepath.Join(xdg, "wmctl", "config.yaml"), "addr: file:1\ntoken_file: tok\ndapr: file-dapr:2\nca: ca.pem\n")
	write(t, filepath.Join(xdg, "wmctl", "tok"), "file-token\n")
	envTokFile := write(t, filepath.Join(dir, "env-tok"), "env-file-token")
	flagTokFile := write(t, filepath.Join(dir, "flag-tok"), " flag-file-token \n")
	work := filepath.Join(dir, "repo")
	write(t, filepath.Join(work, ".run", "dev-token"), "dev-token\n")
	empty := t.TempDir()

	for _, c := range []struct {
		name               string
		env                map[string]string
		workDir            string
		args               []string
		addr, token, dapr  string
		ca                 string
		tls                bool
		wantErr            string
		tokenFromSubstring string
	}{
		{name: "defaults, no token", workDir: empty, addr: defaultAddr, dapr: defaultDapr},
		{name: "dev token from .run", workDir: work, addr: defaultAddr, dapr: defaultDapr, token: "dev-token", tokenFromSubstring: ".run/dev-token"},
		{name: "config file", env: map[string]string{"XDG_CONFIG_HOME": xdg}, workDir: work,
			addr: "file:1", token: "file-token", dapr: "file-dapr:2", ca: filepath.Join(xdg, "wmctl", "ca.pem"), tls: true},
		{name: "config under HOME", env: map[string]string{"HOME": filepath.Join(dir, "nohome")}, workDir: empty, addr: defaultAddr, dapr: defaultDapr},
		{name: "env over file", env: map[string]string{"XDG_CONFIG_HOME": xdg, "WMCTL_ADDR": "env:1", "WMCTL_TOKEN_FILE": envTokFile, "DAPR_GRPC_ADDRESS": "env-dapr:2", "WMCTL_CA": "/env/ca"},
			addr: "env:1", token: "env-file-token", dapr: "env-dapr:2", ca: "/env/ca", tls: true},
		{name: "env token over file token_file", env: map[string]string{"XDG_CONFIG_HOME": xdg, "WMCTL_TOKEN": "env-token"},
			addr: "file:1", token: "env-token", dapr: "file-dapr:2", ca: filepath.Join(xdg, "wmctl", "ca.pem"), tls: true},
		{name: "flags over env", env: map[string]string{"XDG_CONFIG_HOME": xdg, "WMCTL_ADDR": "env:1", "WMCTL_TOKEN": "env-token"},
			args: []string{"--addr", "flag:1", "--token-file", flagTokFile, "--dapr", "flag-dapr:3", "--ca", "/flag/ca"},
			addr: "flag:1", token: "flag-file-token", dapr: "flag-dapr:3", ca: "/flag/ca", tls: true},
		{name: "flag token over everything", env: map[string]string{"WMCTL_TOKEN_FILE": envTokFile}, workDir: work,
			args: []string{"--token", "flag-token"}, addr: defaultAddr, dapr: defaultDapr, token: "flag-token"},
		{name: "WMCTL_TLS", env: map[string]string{"WMCTL_TLS": "true"}, workDir: empty, addr: defaultAddr, dapr: defaultDapr, tls: true},
		{name: "--tls", args: []string{"--tls"}, workDir: empty, addr: defaultAddr, dapr: defaultDapr, tls: true},
		{name: "explicit config", env: map[string]string{"WMCTL_CONFIG": filepath.Join(xdg, "wmctl", "config.yaml")}, workDir: empty,
			addr: "file:1", token: "file-token", dapr: "file-dapr:2", ca: filepath.Join(xdg, "wmctl", "ca.pem"), tls: true},
		{name: "token and token file on one level", env: map[string]string{"WMCTL_TOKEN": "a", "WMCTL_TOKEN_FILE": envTokFile}, wantErr: "both WMCTL_TOKEN and WMCTL_TOKEN_FILE"},
		{name: "missing --config", args: []string{"--config", filepath.Join(dir, "nope.yaml")}, wantErr: "no such file"},
		{name: "missing token file", args: []string{"--token-file", filepath.Join(dir, "nope")}, wantErr: "--token-file"},
		{name: "cert without key", args: []string{"--cert", "c.pem"}, wantErr: "--cert and --key"},
		{name: "bad WMCTL_TLS", env: map[string]string{"WMCTL_TLS": "maybe"}, wantErr: "WMCTL_TLS"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.workDir == "" {
				c.workDir = empty
			}
			cfg, err := config(t, c.env, c.workDir, c.args...)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) || ExitCode(err) != ExitUsage {
					t.Fatalf("err %v (exit %d), want one with %q and exit 2", err, ExitCode(err), c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Addr != c.addr || cfg.Token != c.token || cfg.Dapr != c.dapr || cfg.CA != c.ca || cfg.TLS != c.tls {
				t.Errorf("got addr %q token %q dapr %q ca %q tls %v; want %q %q %q %q %v", cfg.Addr, cfg.Token, cfg.Dapr, cfg.CA, cfg.TLS,
					c.addr, c.token, c.dapr, c.ca, c.tls)
			}
			if !strings.Contains(cfg.TokenFrom, c.tokenFromSubstring) {
				t.Errorf("token from %q, want %q in it", cfg.TokenFrom, c.tokenFromSubstring)
			}
			if cfg.Timeout != defaultTimeout || cfg.Pubsub != defaultPubsub {
				t.Errorf("timeout %v pubsub %q", cfg.Timeout, cfg.Pubsub)
			}
		})
	}
}

func TestConfigFileUnknownKey(t *testing.T) {
	dir := t.TempDir()
	path := write(t, filepath.Join(dir, "c.yaml"), "adress: x:1\n")
	if _, err := config(t, nil, dir, "--config", path); err == nil || !strings.Contains(err.Error(), "adress") {
		t.Fatalf("err %v, want one naming the unknown key", err)
	}
}

func TestExitCodes(t *testing.T) {
	want := map[codes.Code]int{
		codes.OK: 0, codes.Canceled: 1, codes.Unknown: 1, codes.InvalidArgument: 5, codes.DeadlineExceeded: 6,
		codes.NotFound: 3, codes.AlreadyExists: 5, codes.PermissionDenied: 4, codes.ResourceExhausted: 1,
		codes.FailedPrecondition: 5, codes.Aborted: 1, codes.OutOfRange: 5, codes.Unimplemented: 1,
		codes.Internal: 1, codes.Unavailable: 6, codes.DataLoss: 1, codes.Unauthenticated: 4,
	}
	for c, w := range want {
		if got := ExitCodeOf(c); got != w {
			t.Errorf("%s: exit %d, want %d", c, got, w)
		}
		if c == codes.OK {
			continue
		}
		wrapped := fmt.Errorf("outer: %w", &remoteError{what: "the API at x:1", err: status.Error(c, "inner message")})
		if got := ExitCode(wrapped); got != w {
			t.Errorf("wrapped %s: exit %d, want %d", c, got, w)
		}
	}
	if got := ExitCode(nil); got != 0 {
		t.Errorf("nil: %d", got)
	}
	if got := ExitCode(errors.New("x")); got != 1 {
		t.Errorf("plain error: %d", got)
	}
	if got := ExitCode(usageErr(errors.New("x"))); got != 2 {
		t.Errorf("usage error: %d", got)
	}
	if got := ExitCode(fmt.Errorf("x: %w", context.DeadlineExceeded)); got != 6 {
		t.Errorf("deadline: %d", got)
	}
	// The message is the status's, not the chain around it.
	err := fmt.Errorf("outer: %w", &remoteError{what: "the API at x:1", err: status.Error(codes.NotFound, `worker "w" not found`)})
	if got := Message(err); got != `worker "w" not found` {
		t.Errorf("message %q", got)
	}
	err = &remoteError{what: "the API at x:1", timeout: time.Second, err: status.Error(codes.DeadlineExceeded, "context deadline exceeded")}
	if got := Message(err); got != "the API at x:1 did not answer within 1s (--timeout)" {
		t.Errorf("message %q", got)
	}
}

func TestCommandsExitCodesAndMessages(t *testing.T) {
	f := startFake(t, nil)
	f.add(&pb.Worker{WorkerId: "w-1", Name: "pricer", Topic: "orders"})
	env := map[string]string{"WMCTL_ADDR": f.addr, "WMCTL_TOKEN": goodToken}
	for _, c := range []struct {
		args    []string
		env     map[string]string
		code    int
		message string
	}{
		{[]string{"get", "nope"}, env, 3, `wmctl: worker "nope" not found`},
		{[]string{"get", "pricer", "--token", "bad"}, env, 4, "wmctl: missing or unknown credentials"},
		{[]string{"get", "pricer"}, map[string]string{"WMCTL_ADDR": f.addr}, 4, "wmctl: missing or unknown credentials"},
		{[]string{"create", "-", "--mime", MIMEPython, "--topic", ""}, env, 2, "code file - is empty"},
		{[]string{"get", "pricer", "--addr", "127.0.0.1:1"}, env, 6, "wmctl: the API at 127.0.0.1:1 is not reachable"},
		{[]string{"rollback", "pricer", "2"}, env, 1, "wmctl: method RollbackWorker not implemented"},
		{[]string{"get"}, env, 2, "accepts 1 arg"},
		{[]string{"create", "x.py"}, env, 2, `required flag(s) "topic" not set`},
		{[]string{"replay-dead"}, env, 2, "exactly one of"},
		{[]string{"events"}, env, 2, "--follow"},
		// --worker by name needs the API; an unresolved name is an error,
		// not a filter that silently matches nothing.
		{[]string{"events", "--follow", "--worker", "nope"}, env, 3, `wmctl: worker "nope" not found`},
		{[]string{"events", "--follow", "--worker", "pricer", "--addr", "127.0.0.1:1"}, env, 6,
			`wmctl: the API at 127.0.0.1:1 (looking up --worker "pricer"; pass the worker's id to follow without the API) is not reachable`},
		{[]string{"logs", "w-1"}, env, 2, ".run/node.log"}, // no node log in the working directory
	} {
		r := run(t, c.env, "", c.args...)
		if r.code != c.code || !strings.Contains(r.err, c.message) {
			t.Errorf("wmctl %v: exit %d, stderr %q; want %d and %q", c.args, r.code, r.err, c.code, c.message)
		}
	}
	f.mu.Lock()
	f.fail = status.Error(codes.InvalidArgument, "SyntaxError: invalid syntax (line 3)")
	f.mu.Unlock()
	r := run(t, env, "", "list")
	if r.code != 5 || r.err != "wmctl: SyntaxError: invalid syntax (line 3)\n" {
		t.Errorf("INVALID_ARGUMENT: exit %d, stderr %q", r.code, r.err)
	}
	f.mu.Lock()
	f.fail = status.Error(codes.Unavailable, "temporal down")
	f.mu.Unlock()
	if r := run(t, env, "", "list"); r.code != 6 {
		t.Errorf("UNAVAILABLE: exit %d, stderr %q", r.code, r.err)
	}
}

func TestCreateSendsTheRequest(t *testing.T) {
	f := startFake(t, nil)
	dir := t.TempDir()
	py := write(t, filepath.Join(dir, "worker.py"), "def process(e):\n    return None\n")
	pkg := filepath.Join(dir, "echo.zip")
	if err := os.WriteFile(pkg, zipOf(t, "manifest.json"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := f.runOK(t, "create", py, "--topic", "orders", "--group", "shop", "--name", "pricer", "--request-id", "r-1",
		"--allowed-output-topics", "order.*,billing.*", "--allowed-gateway-targets", "billing/charge", "--max-attempts", "5", "--backoff", "2s")
	if out != "w-1\n" {
		t.Errorf("create printed %q, want the id", out)
	}
	out = f.runOK(t, "create", pkg, "--topic", "raw", "-o", "json")
	var resp map[string]any
	if err := json.Unmarshal([]byte(out), &resp); err != nil || resp["workerId"] != "w-2" {
		t.Errorf("create -o json: %q %v", out, err)
	}
	f.runOK(t, "create", "--url", "https://example.com/x.cs", "--sha256", strings.Repeat("0", 64), "--topic", "t", "--mime", MIMEPython)
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.creates[0]
	if c.MimeType != MIMEPython || string(c.GetCode().GetContent()) != "def process(e):\n    return None\n" || c.Topic != "orders" || c.Group != "shop" ||
		c.Name != "pricer" || c.RequestId != "r-1" || strings.Join(c.AllowedOutputTopics, " ") != "order.* billing.*" ||
		strings.Join(c.AllowedGatewayTargets, " ") != "billing/charge" || c.RetryPolicy.GetMaxAttempts() != 5 || c.RetryPolicy.GetBackoffMs() != 2000 {
		t.Errorf("first create sent %v", c)
	}
	if c := f.creates[1]; c.MimeType != MIMENative || c.RetryPolicy != nil {
		t.Errorf("zip create sent %v", c)
	}
	if c := f.creates[2]; c.MimeType != MIMEPython || c.GetCode().GetUrl().GetUrl() != "https://example.com/x.cs" || c.GetCode().GetUrl().GetSha256() != strings.Repeat("0", 64) {
		t.Errorf("URL create sent %v", c)
	}
}

func TestOutputFormats(t *testing.T) {
	f := startFake(t, nil)
	f.pageSize = 2
	for i := 1; i <= 5; i++ {
		f.add(&pb.Worker{WorkerId: fmt.Sprintf("w-%d", i), Topic: "orders", Group: "g", Status: pb.WorkerStatus_WORKER_STATUS_RUNNING,
			CodeVersion: int64(i), MimeType: MIMEPython, UpdatedAt: fixedTime, CreatedAt: fixedTime, RetryPolicy: &pb.RetryPolicy{MaxAttempts: 3}})
	}
	f.workers[0].Name = "pricer"
	f.workers[0].AllowedOutputTopics = []string{"order.*"}

	// list pages through everything; json is an array of workers.
	var ws []map[string]any
	if err := json.Unmarshal([]byte(f.runOK(t, "list", "-o", "json")), &ws); err != nil || len(ws) != 5 {
		t.Fatalf("list -o json: %v %v", ws, err)
	}
	if ws[0]["workerId"] != "w-1" || ws[0]["name"] != "pricer" || ws[0]["status"] != "WORKER_STATUS_RUNNING" || ws[4]["codeVersion"] != "5" ||
		ws[1]["name"] != "" || ws[0]["createdAt"] != "2025-01-02T03:04:05Z" {
		t.Errorf("list -o json: %v", ws)
	}
	// yaml carries the same document.
	var wy []map[string]any
	if err := yaml.Unmarshal([]byte(f.runOK(t, "list", "-o", "yaml")), &wy); err != nil || len(wy) != 5 || wy[0]["workerId"] != "w-1" || wy[4]["codeVersion"] != "5" {
		t.Fatalf("list -o yaml: %v %v", wy, err)
	}
	table := f.runOK(t, "list")
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 6 || strings.Join(strings.Fields(lines[0]), " ") != "ID NAME TOPIC GROUP STATUS VERSION MIME UPDATED" ||
		strings.Join(strings.Fields(lines[1]), " ") != "w-1 pricer orders g RUNNING 1 text/x-python 2025-01-02T03:04:05Z" ||
		strings.Join(strings.Fields(lines[2]), " ") != "w-2 - orders g RUNNING 2 text/x-python 2025-01-02T03:04:05Z" {
		t.Errorf("list table:\n%s", table)
	}
	// Columns line up.
	if strings.Index(lines[0], "TOPIC") != strings.Index(lines[1], "orders") {
		t.Errorf("columns not aligned:\n%s", table)
	}

	// get: one message; the table is a field per line.
	var w map[string]any
	if err := json.Unmarshal([]byte(f.runOK(t, "get", "pricer", "-o", "json")), &w); err != nil || w["workerId"] != "w-1" ||
		fmt.Sprint(w["allowedOutputTopics"]) != "[order.*]" || fmt.Sprint(w["retryPolicy"]) != "map[backoffMs:0 maxAttempts:3]" {
		t.Errorf("get -o json: %v %v", w, err)
	}
	y := f.runOK(t, "get", "pricer", "-o", "yaml")
	if !strings.Contains(y, "workerId: w-1\n") || !strings.Contains(y, "allowedOutputTopics:\n  - order.*\n") || !strings.Contains(y, "codeVersion: \"1\"\n") {
		t.Errorf("get -o yaml:\n%s", y)
	}
	detail := f.runOK(t, "get", "pricer")
	for _, want := range []string{"ID:", "w-1", "Name:", "pricer", "Status:", "RUNNING", "Retry policy:", "max attempts 3, backoff default", "Allowed output topics:", "order.*", "Allowed gateway targets:", "any"} {
		if !strings.Contains(detail, want) {
			t.Errorf("get table lacks %q:\n%s", want, detail)
		}
	}

	// history: an array of entries.
	var hs []map[string]any
	if err := json.Unmarshal([]byte(f.runOK(t, "history", "w-1", "-o", "json")), &hs); err != nil || len(hs) != 2 || hs[1]["action"] != "rollback" || hs[1]["rollbackTo"] != "1" {
		t.Errorf("history -o json: %v %v", hs, err)
	}
	ht := f.runOK(t, "history", "w-1")
	if !strings.Contains(ht, "VERSION") || !strings.Contains(ht, "rollback") || !strings.Contains(ht, "bbbbbbbbbbbb…") {
		t.Errorf("history table:\n%s", ht)
	}

	// start/stop answer the worker.
	if out := f.runOK(t, "stop", "pricer"); !strings.Contains(out, "STOPPED") {
		t.Errorf("stop:\n%s", out)
	}
	var sw map[string]any
	if err := json.Unmarshal([]byte(f.runOK(t, "start", "pricer", "-o", "json")), &sw); err != nil || sw["status"] != "WORKER_STATUS_RUNNING" {
		t.Errorf("start -o json: %v %v", sw, err)
	}

	// dead letters, replay, recover, delete.
	var ds []map[string]any
	if err := json.Unmarshal([]byte(f.runOK(t, "dead", "w-1", "-o", "json")), &ds); err != nil || len(ds) != 1 || ds[0]["eventId"] != "o-1" || ds[0]["attempts"] != 3.0 {
		t.Errorf("dead -o json: %v %v", ds, err)
	}
	if out := f.runOK(t, "dead-letters", "w-1"); !strings.Contains(out, "worker_failed") || !strings.Contains(out, "ValueError: boom") {
		t.Errorf("dead-letters table:\n%s", out)
	}
	if out := f.runOK(t, "replay-dead", "--topic", "orders", "--event-id", "o-1,o-2", "--reason", "timeout", "--limit", "7"); out != "replayed 1, remaining 2\no-1\n" {
		t.Errorf("replay-dead: %q", out)
	}
	f.runOK(t, "replay-dead", "pricer")
	f.mu.Lock()
	if r := f.replays[0]; r.Topic != "orders" || r.WorkerId != "" || strings.Join(r.EventIds, ",") != "o-1,o-2" || r.Reason != "timeout" || r.Limit != 7 {
		t.Errorf("replay request %v", r)
	}
	if r := f.replays[1]; r.WorkerId != "pricer" {
		t.Errorf("replay request %v", r)
	}
	f.mu.Unlock()
	if out := f.runOK(t, "recover", "-o", "yaml"); out != "recovered: 4\nfailed: 1\n" {
		t.Errorf("recover -o yaml: %q", out)
	}
	if out := f.runOK(t, "delete", "w-5"); out != "deleted w-5\n" {
		t.Errorf("delete: %q", out)
	}
	if out := f.runOK(t, "delete", "w-4", "-o", "json"); out != "{}\n" {
		t.Errorf("delete -o json: %q", out)
	}
	dir := t.TempDir()
	code := write(t, filepath.Join(dir, "v2.py"), "def process(e): pass\n")
	if out := f.runOK(t, "reload", "pricer", code); !strings.Contains(out, "w-1") {
		t.Errorf("reload: %q", out)
	}
}

func TestListEmpty(t *testing.T) {
	f := startFake(t, nil)
	if out := f.runOK(t, "list", "-o", "json"); out != "[]\n" {
		t.Errorf("empty list -o json: %q", out)
	}
	if out := f.runOK(t, "list", "-o", "yaml"); out != "[]\n" {
		t.Errorf("empty list -o yaml: %q", out)
	}
}

func TestMutualTLS(t *testing.T) {
	files, err := devstack.DevTLS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(files.ServerCert, files.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(files.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	f := startFake(t, credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}))
	f.add(&pb.Worker{WorkerId: "w-1"})
	env := map[string]string{"WMCTL_ADDR": f.addr, "WMCTL_TOKEN": goodToken, "WMCTL_CA": files.CA}
	if r := run(t, env, "", "get", "w-1", "--cert", files.ClientCert, "--key", files.ClientKey); r.code != 0 {
		t.Fatalf("mTLS: exit %d %s", r.code, r.err)
	}
	if r := run(t, env, "", "get", "w-1"); r.code == 0 {
		t.Fatal("no client certificate accepted")
	}
	if r := run(t, map[string]string{"WMCTL_ADDR": f.addr, "WMCTL_TOKEN": goodToken}, "", "get", "w-1", "--tls"); r.code != 6 {
		t.Fatalf("untrusted server certificate: exit %d %s", r.code, r.err)
	}
}

func TestDevTokenIsUsed(t *testing.T) {
	f := startFake(t, nil)
	f.add(&pb.Worker{WorkerId: "w-1"})
	work := t.TempDir()
	write(t, filepath.Join(work, ".run", "dev-token"), goodToken+"\n")
	if r := run(t, map[string]string{"WMCTL_ADDR": f.addr}, work, "list"); r.code != 0 || !strings.Contains(r.out, "w-1") {
		t.Fatalf("list with .run/dev-token: exit %d %q %q", r.code, r.out, r.err)
	}
}

func TestSpinnerOnlyOnTerminals(t *testing.T) {
	var buf bytes.Buffer
	startSpinner(&buf, false, "x")()
	if buf.Len() != 0 {
		t.Errorf("spinner wrote %q without a terminal", buf.String())
	}
	stop := startSpinner(&buf, true, "creating worker")
	time.Sleep(150 * time.Millisecond)
	stop()
	stop()
	if s := buf.String(); !strings.Contains(s, "creating worker…") || !strings.HasSuffix(s, "\r\033[K") {
		t.Errorf("spinner wrote %q", s)
	}
}
