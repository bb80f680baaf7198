package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The five-minute path of docs/python-workers.md, command by command: every
// sh block between its guide:begin and guide:end markers runs, in order, in
// one bash with -euo pipefail, at a "repository root" that links to this
// checkout's sdk/ and .tools/ and to this test's stack as .run/, with the
// addresses of that stack; Debian's python3 (with pytest and mypy, which
// `make test` installs) comes first on PATH.
func testPythonWorkersGuide(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot(), "docs", "python-workers.md"))
	if err != nil {
		t.Fatal(err)
	}
	begin, end := strings.Index(string(doc), "<!-- guide:begin -->"), strings.Index(string(doc), "<!-- guide:end -->")
	if begin < 0 || end < begin {
		t.Fatal("docs/python-workers.md has no guide:begin / guide:end markers")
	}
	var script strings.Builder
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(doc)[begin:end], -1) {
		script.WriteString(m[1])
	}
	if !strings.Contains(script.String(), "virtufin_worker new") {
		t.Fatalf("no guide commands found:\n%s", script.String())
	}

	e := sharedEnv(t)
	root := t.TempDir()
	for name, target := range map[string]string{"sdk": filepath.Join(repoRoot(), "sdk"), ".tools": filepath.Join(repoRoot(), ".tools"), ".run": e.stack.Dir} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	redisPort := e.stack.RedisAddr[strings.LastIndex(e.stack.RedisAddr, ":")+1:]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script.String())
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "PATH=/usr/bin:/bin:"+os.Getenv("PATH"), "PIP_NO_CACHE_DIR=1", "PYTHONDONTWRITEBYTECODE=1",
		"WM_API="+e.apiAddr, "WM_DAPR_HTTP="+e.stack.DaprHTTPAddr, "WM_REDIS_PORT="+redisPort)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the guide failed: %v\n%s", err, out)
	}
	for _, want := range []string{"passed", "Success: no issues found", `"ok": true`, "Hello, Ada!", "c-1"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the guide's output lacks %q:\n%s", want, out)
		}
	}
}
