package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// The guides, command by command, in the order a new user meets them
// (issue 44 item 6): the README's walkthrough first, then the pages it
// links to. Each runs in a subtest of its own on the shared stack, all on
// one "repository root" (guideRoot), so a guide that reused a name or a
// topic another one left behind fails here as it would for a user.
var guides = []struct {
	name, file string
	// want is what the guide's output must show.
	want []string
}{
	{"readme", "README.md", []string{`correlationid="c-42"`, `"total":6`, "KeyError", "msg=\"worker attempt failed\""}},
	{"workers", "docs/workers.md", []string{`"text":"Hello, Ada"`, `msg="saying hello to Ada"`, "logger=hello", "example.echoed", `"total":6`}},
	{"python-workers", "docs/python-workers.md", []string{"passed", "Success: no issues found", `"ok": true`, "Hello, Ada!", `correlationid="c-1"`, "greeting Ada"}},
	{"wmctl", "cmd/wmctl/README.md", []string{`no running worker subscribes to topic "ordrs"`, `"order_id":"cli-1"`, "is the input of cli-pricer", "exit 2", "taken by a deleted worker", "exit 5"}},
	{"operating", "docs/operating.md", []string{`"total":6`, "workmanager-worker-"}},
	{"api", "docs/api.md", []string{"Unauthenticated", "c-7", `"name": "api-pricer"`, "taken by a deleted worker", `"checks"`, "temporal-pricer"}},
}

// testGuides runs every guide: each sh block between a guide:begin and a
// guide:end marker, in order, in one bash with -euo pipefail, with
// `make run`'s addresses in the commands replaced by this stack's; a
// fenced block after a guide:file marker is first written to that file.
// The root links to this checkout's bin/ (the test's build: bin/wmctl),
// examples/, sdk/ and .tools/ and to the stack as .run/, as `make run`
// leaves a checkout; nothing else of the repository is there. PATH is the
// process's own, after a directory whose python3 is not Debian's and has no
// pytest or mypy (as pyenv's shims come first on many machines): a guide
// must name the interpreter `make run` equips.
func testGuides(t *testing.T) {
	e := sharedEnv(t)
	root := guideRoot(t, e)
	for _, g := range guides {
		if !t.Run(g.name, func(t *testing.T) { runGuide(t, e, root, g.file, g.want) }) {
			return // later guides build on the earlier ones' state
		}
	}
}

// guideRoot makes the guides' repository root.
func guideRoot(t *testing.T, e *env) string {
	root := t.TempDir()
	for name, target := range map[string]string{
		"bin": buildBinaries(t), "examples": filepath.Join(repoRoot(), "examples"), "sdk": filepath.Join(repoRoot(), "sdk"),
		".tools": filepath.Join(repoRoot(), ".tools"), ".run": e.stack.Dir,
	} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

var (
	guideBlock = regexp.MustCompile("(?s)<!-- guide:file ([^ ]+) -->\\s*```[a-z]*\n(.*?)```|```sh\n(.*?)```")
	guideSpan  = regexp.MustCompile("(?s)<!-- guide:begin -->(.*?)<!-- guide:end -->")
)

// guideScript is the file's guide: its guide:file blocks as commands that
// write them, and its sh blocks inside guide:begin / guide:end.
func guideScript(t *testing.T, doc string) string {
	var script strings.Builder
	spans := guideSpan.FindAllStringSubmatchIndex(doc, -1)
	inSpan := func(i int) bool {
		for _, s := range spans {
			if i >= s[0] && i < s[1] {
				return true
			}
		}
		return false
	}
	for _, m := range guideBlock.FindAllStringSubmatchIndex(doc, -1) {
		switch {
		case m[2] >= 0: // a file
			name, body := doc[m[2]:m[3]], doc[m[4]:m[5]]
			fmt.Fprintf(&script, "cat > %q <<'GUIDE_FILE_EOF'\n%sGUIDE_FILE_EOF\n", name, body)
		case inSpan(m[0]):
			script.WriteString(doc[m[6]:m[7]])
		}
	}
	if len(spans) == 0 || script.Len() == 0 {
		t.Fatal("no guide:begin / guide:end markers around sh blocks")
	}
	return script.String()
}

func runGuide(t *testing.T, e *env, root, file string, want []string) {
	doc, err := os.ReadFile(filepath.Join(repoRoot(), file))
	if err != nil {
		t.Fatal(err)
	}
	script := guideScript(t, string(doc))
	// make run's addresses (README's table) → this stack's.
	node := strings.TrimPrefix(e.nodeURL, "http://")
	redisPort := e.stack.RedisAddr[strings.LastIndex(e.stack.RedisAddr, ":")+1:]
	script = strings.NewReplacer(
		"127.0.0.1:50051", e.apiAddr, "127.0.0.1:50001", e.stack.DaprGRPCAddr, "127.0.0.1:3500", e.stack.DaprHTTPAddr,
		"127.0.0.1:8080", node, "127.0.0.1:7233", e.stack.TemporalAddr, "-p 6380", "-p "+redisPort,
	).Replace(script)

	notDebian := filepath.Join(t.TempDir(), "pyenv-shims")
	if err := os.Mkdir(notDebian, 0o755); err != nil {
		t.Fatal(err)
	}
	shim := "#!/bin/sh\n# Not Debian's python3: no site-packages, so no pytest, no mypy (like a pyenv build).\nexec /usr/bin/python3 -S \"$@\"\n"
	for _, n := range []string{"python3", "python"} {
		if err := os.WriteFile(filepath.Join(notDebian, n), []byte(shim), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = root
	cmd.WaitDelay = 5 * time.Second
	// A newcomer's shell: none of the caller's own wmctl settings (a
	// WMCTL_TOKEN exported for another stack made every call of the
	// README's walkthrough "not valid"), no wmctl config of theirs.
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "WMCTL_") }),
		"XDG_CONFIG_HOME="+t.TempDir(),
		"PATH="+notDebian+":"+os.Getenv("PATH"), "PIP_NO_CACHE_DIR=1", "PYTHONDONTWRITEBYTECODE=1",
		// wmctl's own defaults are make run's addresses: point them here.
		"WMCTL_ADDR="+e.apiAddr, "DAPR_GRPC_ADDRESS="+e.stack.DaprGRPCAddr,
		// make run's Temporal namespace is "default"; the test stacks' are not.
		"TEMPORAL_NAMESPACE="+e.stack.TemporalNamespace())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s failed: %v\n--- script\n%s\n--- output\n%s", file, err, script, out)
	}
	for _, w := range want {
		if !strings.Contains(string(out), w) {
			t.Errorf("%s: the output lacks %q:\n%s", file, w, out)
		}
	}
}
