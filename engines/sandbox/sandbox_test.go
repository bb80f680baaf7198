package sandbox_test

import (
	"bufio"
	"context"
	"hash/fnv"
	"log/slog"
	"os"
	"slices"
	"strconv"
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
	s, err := sandbox.New(context.Background(), sandbox.Config{Mode: sandbox.Strict, Log: quiet(), Exec: sandboxtest.ExecPath(t)})
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
	for _, want := range []string{sandbox.LayerNamespaces, sandbox.LayerUser, sandbox.LayerSeccomp, sandbox.LayerLimits, sandbox.LayerEnv, sandbox.LayerDescriptors, sandbox.LayerMemory} {
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

// strict is a strict sandbox of cfg, or a skip (a failure with
// sandboxtest.RequireEnv) where the layers cannot exist.
func strict(t *testing.T, cfg sandbox.Config) *sandbox.Sandbox {
	t.Helper()
	cfg.Mode, cfg.Log = sandbox.Strict, quiet()
	if cfg.Exec == "" {
		cfg.Exec = sandboxtest.ExecPath(t)
	}
	s, err := sandbox.New(context.Background(), cfg)
	if err != nil {
		if os.Getenv(sandboxtest.RequireEnv) != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	return s
}

// start runs script for owner in s and returns its first line of output;
// the process lives until the test ends.
func start(t *testing.T, s *sandbox.Sandbox, owner, script string) string {
	t.Helper()
	cmd, done, err := s.Command(sandbox.Spec{Owner: owner, Path: "/bin/sh", Args: []string{"-c", script}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		done()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("%s: %v", owner, err)
	}
	return strings.TrimSpace(line)
}

// Issue 32 item 5: the user id was fnv64a(id) % 50000, so a tenant could
// pick a worker name whose id shares another tenant's user id (acme's
// "w1940" and globex's "billing"). Ids are allocated now: two live
// workers never share one.
func TestCollidingWorkerIDsGetTheirOwnUID(t *testing.T) {
	const acme, globex = "acme.ef5e0277-16f9-5675-886d-f87dfa59b5ae", "globex.9605ae14-93f8-503a-875c-f72e05cf6b1f"
	hash := func(s string) uint64 { h := fnv.New64a(); h.Write([]byte(s)); return h.Sum64() % 50000 }
	if hash(acme) != hash(globex) {
		t.Fatalf("the ids no longer collide under the old scheme: %d, %d", hash(acme), hash(globex))
	}
	s := strict(t, sandbox.Config{})
	a := start(t, s, acme, "id -u; exec sleep 60")
	b := start(t, s, globex, "id -u; exec sleep 60")
	a2 := start(t, s, acme, "id -u; exec sleep 60")
	if a == b || a != a2 {
		t.Fatalf("uids: acme %s and %s, globex %s; want one per worker, never shared", a, a2, b)
	}
	if u, ok := s.UID(acme); !ok || strconv.Itoa(u) != a {
		t.Errorf("UID(acme) = %d %v; want %s", u, ok, a)
	}
}

// A live worker process's /tmp and /scratch are mounted in its own mount
// namespace (by cmd/sandbox-exec), not in the node's: the node's mount
// table, which every bubblewrap start copies and reads, does not grow
// with its workers; each process still has its own two, sized.
func TestWorkerMountsStayOutOfTheNodesMountTable(t *testing.T) {
	s := strict(t, sandbox.Config{TmpBytes: 4 << 20, ScratchBytes: 8 << 20})
	own := "/workmanager-sandbox/" + strconv.Itoa(os.Getpid()) + "-"
	for i := range 3 {
		owner := "mounts-" + strconv.Itoa(i)
		got := strings.Fields(start(t, s, owner, `echo $(df -k /tmp /scratch | tail -2); exec sleep 60`))
		if len(got) != 12 || got[0] != "tmpfs" || got[1] != "4096" || got[6] != "tmpfs" || got[7] != "8192" {
			t.Errorf("%s: df says %q; want its two tmpfs of 4096 and 8192 KiB", owner, got)
		}
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), own); n != 0 {
		t.Errorf("with 3 processes live the node's mount table holds %d of their mounts; want none:\n%s", n, b)
	}
}

// Issue 32 item 3: /tmp and /scratch are tmpfs of the configured sizes
// (the default 64 MiB each when unset): a write past them fails with
// ENOSPC inside, and nothing reaches the node's disk or memory beyond it.
func TestTmpAndScratchAreSized(t *testing.T) {
	s := strict(t, sandbox.Config{TmpBytes: 4 << 20, ScratchBytes: 8 << 20})
	for dir, limit := range map[string]int{"/tmp": 4 << 20, "/scratch": 8 << 20} {
		cmd, done, err := s.Command(sandbox.Spec{Owner: "sized", Path: "/bin/sh", Args: []string{"-c",
			`head -c 50000000 /dev/zero > ` + dir + `/fill; echo "rc=$?"; stat -c %s ` + dir + `/fill; df -k ` + dir + ` | tail -1`}})
		if err != nil {
			t.Fatal(err)
		}
		out, err := cmd.CombinedOutput()
		done()
		if err != nil {
			t.Fatalf("%s: %v: %s", dir, err, out)
		}
		text := string(out)
		if !strings.Contains(text, "No space left on device") || strings.Contains(text, "rc=0") {
			t.Errorf("%s: writing 50 MB: %s; want ENOSPC", dir, text)
		}
		lines := strings.Split(strings.TrimSpace(text), "\n")
		if len(lines) < 2 {
			t.Fatalf("%s: output %q", dir, text)
		}
		if n, err := strconv.Atoi(lines[len(lines)-2]); err != nil || n > limit {
			t.Errorf("%s: the file grew to %q bytes; want at most %d", dir, lines[len(lines)-2], limit)
		}
		if f := strings.Fields(lines[len(lines)-1]); len(f) < 2 || f[1] != strconv.Itoa(limit>>10) {
			t.Errorf("%s: df says %q; want a filesystem of %d KiB", dir, lines[len(lines)-1], limit>>10)
		}
	}
	// Released processes leave no mount behind.
	if b, err := os.ReadFile("/proc/self/mountinfo"); err != nil || strings.Contains(string(b), "/workmanager-sandbox/"+strconv.Itoa(os.Getpid())+"-") {
		t.Errorf("mounts left after the processes were released (%v):\n%s", err, b)
	}
	// The file count is bounded too (tmpfs's default inode count is half
	// the machine's pages: gigabytes of kernel memory in empty files): one
	// inode per 4 KiB of size, here at least 1024.
	for _, dir := range []string{"/tmp", "/scratch"} {
		got := start(t, s, "inodes", `i=0; while [ $i -lt 100000 ] && true 2>/dev/null > `+dir+`/f$i; do i=$((i+1)); done; echo $i`)
		if n, err := strconv.Atoi(got); err != nil || n > 2048 {
			t.Errorf("%s: %s empty files made; want at most 2048", dir, got)
		}
		t.Logf("%s: %s empty files, then ENOSPC", dir, got)
	}
	// Unset, both are 64 MiB.
	d := strict(t, sandbox.Config{})
	if got := start(t, d, "defaults", `echo $(df -k /tmp /scratch | tail -2)`); strings.Count(got, "tmpfs 65536 ") != 2 {
		t.Errorf("default sizes: df says %q; want two tmpfs of 65536 KiB", got)
	}
}
