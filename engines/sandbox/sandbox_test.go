package sandbox_test

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/virtufin/workmanager/engines/sandbox"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestParseMode(t *testing.T) {
	for in, want := range map[string]sandbox.Mode{"strict": sandbox.Strict, " Standard ": sandbox.Standard, "off": sandbox.Off} {
		if got, err := sandbox.ParseMode(in); err != nil || got != want {
			t.Errorf("%q: %v %v", in, got, err)
		}
	}
	if _, err := sandbox.ParseMode("loose"); err == nil || !strings.Contains(err.Error(), `"strict", "standard" or "off"`) {
		t.Errorf("bad mode: %v", err)
	}
}

// Off is loud and passes the node's environment on, as before the sandbox.
func TestOffRunsUnconfined(t *testing.T) {
	s, err := sandbox.New(context.Background(), sandbox.Config{Mode: sandbox.Off, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if s.Complete() || !strings.Contains(s.Summary(), "unconfined") && !strings.Contains(s.Summary(), "runs as the node") {
		t.Fatalf("summary %q", s.Summary())
	}
	t.Setenv("WM_SANDBOX_TEST", "visible")
	cmd, done, err := s.Command(sandbox.Spec{Path: "/bin/sh", Args: []string{"-c", "echo $WM_SANDBOX_TEST $W"}, Env: []string{"W=w"}})
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	out, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(out)) != "visible w" {
		t.Fatalf("out %q err %v", out, err)
	}
}

// Strict either has every layer or refuses to start, naming what is missing.
func TestStrictHasEveryLayerOrRefuses(t *testing.T) {
	s, err := sandbox.New(context.Background(), sandbox.Config{Mode: sandbox.Strict, ScratchRoot: t.TempDir(), Log: quiet()})
	if err != nil {
		if !strings.Contains(err.Error(), "SANDBOX=strict") {
			t.Fatalf("refusal does not say why: %v", err)
		}
		if os.Getenv(sandboxtest.RequireEnv) != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	if !s.Complete() {
		t.Fatalf("strict sandbox with missing layers: %s", s.Summary())
	}
	var names []string
	for _, l := range s.Layers() {
		names = append(names, l.Name)
	}
	for _, want := range []string{sandbox.LayerNamespaces, sandbox.LayerUser, sandbox.LayerSeccomp, sandbox.LayerLimits, sandbox.LayerEnv} {
		if !slices.Contains(names, want) {
			t.Errorf("layer %s missing from %v", want, names)
		}
	}
	// One worker keeps its user id across processes; the environment is
	// only what the spec gives; the seccomp filter is on.
	run := func(owner string) string {
		cmd, done, err := s.Command(sandbox.Spec{Owner: owner, Path: "/bin/sh",
			Args: []string{"-c", `echo "$(id -u) $W $HOME $(grep ^Seccomp: /proc/self/status | tr -d '\t')"`}, Env: []string{"W=w"}})
		if err != nil {
			t.Fatal(err)
		}
		defer done()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	a1, a2, b := run("worker-a"), run("worker-a"), run("worker-b")
	if a1 != a2 || strings.Fields(a1)[0] == strings.Fields(b)[0] {
		t.Errorf("uids: a %q then %q, b %q; want one per worker", a1, a2, b)
	}
	if f := strings.Fields(a1); len(f) != 4 || f[1] != "w" || f[2] != "/scratch" || f[3] != "Seccomp:2" {
		t.Errorf("inside: %q; want uid, W=w, HOME=/scratch, seccomp filter mode 2", a1)
	}
}
