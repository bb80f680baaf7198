package sandbox_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/virtufin/workmanager/engines/sandbox"
)

// Issue 32, round two, gap 3: user ids were unique per node process only:
// two node processes on one host (or privileged replicas on one
// Kubernetes host) gave the same worker, or two colliding ones, one id,
// since the preferred id is a public hash of the worker id. Node
// processes that share the claim directory never do now, and an id comes
// free for the other node once its worker left.
func TestTwoNodesOnOneHostNeverShareAUID(t *testing.T) {
	dir := t.TempDir()
	n1 := strict(t, sandbox.Config{UIDClaimDir: dir})
	n2 := strict(t, sandbox.Config{UIDClaimDir: dir})
	const w = "acme.ef5e0277-16f9-5675-886d-f87dfa59b5ae"
	a := start(t, n1, w, "id -u; exec sleep 60")
	b := start(t, n2, w, "id -u; exec sleep 60")
	if a == b {
		t.Fatalf("two node processes on one host gave %s to a live worker each", a)
	}
	if !layerDetail(n1, "unique on this host (claimed in "+dir+")") {
		t.Errorf("layers %v; want the user layer to say where ids are claimed", n1.Layers())
	}
	// Without claims (the old behaviour) both take the preferred id.
	o1 := strict(t, sandbox.Config{UIDClaimDir: "-"})
	o2 := strict(t, sandbox.Config{UIDClaimDir: "-"})
	if x, y := start(t, o1, w+"-x", "id -u; exec sleep 60"), start(t, o2, w+"-x", "id -u; exec sleep 60"); x != y {
		t.Errorf("without claims: %s and %s; the test no longer shows the collision", x, y)
	}
	// A released id can be claimed by the other node.
	cmd, done, err := n1.Command(sandbox.Spec{Owner: "leaver", Path: "/bin/sh", Args: []string{"-c", "id -u"}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.Output()
	done()
	if err != nil {
		t.Fatal(err)
	}
	if got := start(t, n2, "leaver", "id -u; exec sleep 60"); got != strings.TrimSpace(string(out)) {
		t.Errorf("after n1's worker left, n2 gave it %s; want its preferred %s back", got, strings.TrimSpace(string(out)))
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*")); len(m) < 3 {
		t.Errorf("claim files %v; want one per id used", m)
	}
}

func layerDetail(s *sandbox.Sandbox, want string) bool {
	for _, l := range s.Layers() {
		if l.Name == sandbox.LayerUser && strings.Contains(l.Detail, want) {
			return true
		}
	}
	return false
}
