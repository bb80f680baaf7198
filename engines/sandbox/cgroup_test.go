package sandbox

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The memory layer on cgroup v2 (not mounted with a memory controller on
// the development machines: a file tree stands in for the delegated
// subtree): the node moves itself into a leaf, enables the memory
// controller for its subtree and for "workers", and each process's group
// under "workers" gets memory.max, no swap and whole-group OOM kills.
func TestMemcgV2OnADelegatedSubtree(t *testing.T) {
	root := t.TempDir()
	old := cgroupRoot
	cgroupRoot = root
	t.Cleanup(func() { cgroupRoot = old })
	own := filepath.Join(root, "kubepods", "pod1")
	if err := os.MkdirAll(own, 0o755); err != nil {
		t.Fatal(err)
	}
	for f, v := range map[string]string{
		filepath.Join(root, "cgroup.controllers"):    "cpu io memory pids",
		filepath.Join(own, "cgroup.controllers"):     "cpu memory pids",
		filepath.Join(own, "cgroup.subtree_control"): "",
	} {
		if err := os.WriteFile(f, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := ownCgroup([]byte("0::/kubepods/pod1\n"), ""); got != "/kubepods/pod1" {
		t.Fatalf("ownCgroup v2: %q", got)
	}
	if got := ownCgroup([]byte("4:memory:/a/b\n0::/\n"), "memory"); got != "/a/b" {
		t.Fatalf("ownCgroup v1: %q", got)
	}
	m, err := detectV2(own)
	if err != nil {
		t.Fatal(err)
	}
	if m.version != 2 || m.parent != filepath.Join(own, "workers") {
		t.Fatalf("memcg %+v", m)
	}
	read := func(p string) string { b, _ := os.ReadFile(p); return strings.TrimSpace(string(b)) }
	if got := read(filepath.Join(own, "node", "cgroup.procs")); got != strconv.Itoa(os.Getpid()) {
		t.Errorf("the node's leaf holds %q, want this process", got)
	}
	for _, d := range []string{own, m.parent} {
		if got := read(filepath.Join(d, "cgroup.subtree_control")); got != "+memory" {
			t.Errorf("%s/cgroup.subtree_control = %q, want +memory", d, got)
		}
	}
	procs, release, err := m.create(300 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	dir := filepath.Dir(procs)
	if filepath.Dir(dir) != m.parent || filepath.Base(procs) != "cgroup.procs" {
		t.Fatalf("group %s not under %s", procs, m.parent)
	}
	for f, want := range map[string]string{"memory.max": strconv.Itoa(300 << 20), "memory.swap.max": "0", "memory.oom.group": "1"} {
		if got := read(filepath.Join(dir, f)); got != want {
			t.Errorf("%s = %q, want %q", f, got, want)
		}
	}

	// Without the controller delegated, no layer (and a reason).
	other := filepath.Join(root, "other")
	_ = os.MkdirAll(other, 0o755)
	_ = os.WriteFile(filepath.Join(other, "cgroup.controllers"), []byte("cpu pids"), 0o644)
	if _, err := detectV2(other); err == nil || !strings.Contains(err.Error(), "not delegated") {
		t.Errorf("no memory controller: %v", err)
	}
}
