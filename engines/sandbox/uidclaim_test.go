package sandbox_test

import (
	"crypto/sha256"
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines/sandbox"
)

// Issue 32, round two, gap 3: user ids were unique per node process only:
// two node processes on one host (or privileged replicas on one
// Kubernetes host) could give two workers whose preferred ids collide one
// id, since the preferred id is a public hash of the worker id. Node
// processes that share the claim directory never do now; one worker run
// by both keeps one id (its files on a shared writable path stay its own:
// a group's workers run on every node), and an id comes free for the
// other node once its worker left.
func TestTwoNodesOnOneHostNeverShareAUID(t *testing.T) {
	dir := t.TempDir()
	n1 := strict(t, sandbox.Config{UIDClaimDir: dir})
	n2 := strict(t, sandbox.Config{UIDClaimDir: dir})
	const w = "acme.ef5e0277-16f9-5675-886d-f87dfa59b5ae"
	other := collidingOwner(t, w)
	a := start(t, n1, w, "id -u; exec sleep 60")
	if b := start(t, n2, w, "id -u; exec sleep 60"); a != b {
		t.Fatalf("one worker on two node processes of one host: ids %s and %s; want one", a, b)
	}
	if c := start(t, n2, other, "id -u; exec sleep 60"); c == a {
		t.Fatalf("two node processes on one host gave %s to two live workers (%s on n1, %s on n2)", a, w, other)
	}
	if !layerDetail(n1, "unique on this host (claimed in "+dir+")") {
		t.Errorf("layers %v; want the user layer to say where ids are claimed", n1.Layers())
	}
	// Without claims (the old behaviour) the colliding workers share it.
	o1 := strict(t, sandbox.Config{UIDClaimDir: "-"})
	o2 := strict(t, sandbox.Config{UIDClaimDir: "-"})
	if x, y := start(t, o1, w, "id -u; exec sleep 60"), start(t, o2, other, "id -u; exec sleep 60"); x != y {
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

// One worker attached by two node processes of one host at the same
// moment keeps one id: a claim found in progress (another node process
// holding the claim file's exclusive lock until its owner is written) is
// waited for, not taken for another worker's (the group tests' workers,
// on both nodes, then wrote a shared file as two ids: "Permission
// denied"). A claim held longer than the wait (a paused node process)
// makes the id count as taken, and the attach goes on with another.
func TestAClaimInProgressIsWaitedFor(t *testing.T) {
	const w = "acme.0d3a3f0e-2f6c-5b8e-9a51-3c1c2f7e9b10"
	pref := func(s string) int {
		sum := sha256.Sum256([]byte(s))
		return 200000 + int(binary.BigEndian.Uint64(sum[:8])%50000)
	}
	uid := strconv.Itoa(pref(w))
	for _, paused := range []bool{false, true} {
		dir := t.TempDir()
		// The other node process, mid-claim: the exclusive lock taken,
		// the owner written only after a while (or never: paused).
		f, err := os.OpenFile(filepath.Join(dir, uid), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			t.Fatal(err)
		}
		written := make(chan struct{})
		if paused {
			close(written)
		} else {
			go func() {
				defer close(written)
				time.Sleep(300 * time.Millisecond)
				f.WriteAt([]byte(w), 0)
				syscall.Flock(int(f.Fd()), syscall.LOCK_SH)
			}()
		}
		n := strict(t, sandbox.Config{UIDClaimDir: dir})
		got := start(t, n, w, "id -u; exec sleep 60")
		<-written
		switch {
		case !paused && got != uid:
			t.Fatalf("a claim in progress by another node process for the same worker: got id %s, want the shared %s", got, uid)
		case paused && got == uid:
			t.Fatalf("a claim held by a paused node process: got its id %s", got)
		}
	}
}

// collidingOwner finds a worker id whose preferred user id (the sandbox's
// public hash, SHA-256 mod the default 50,000 ids) is w's.
func collidingOwner(t *testing.T, w string) string {
	t.Helper()
	pref := func(s string) uint64 {
		sum := sha256.Sum256([]byte(s))
		return binary.BigEndian.Uint64(sum[:8]) % 50000
	}
	want := pref(w)
	for i := 0; i < 2_000_000; i++ {
		if o := "globex.w" + strconv.Itoa(i); pref(o) == want {
			return o
		}
	}
	t.Fatal("no colliding worker id found")
	return ""
}

func layerDetail(s *sandbox.Sandbox, want string) bool {
	for _, l := range s.Layers() {
		if l.Name == sandbox.LayerUser && strings.Contains(l.Detail, want) {
			return true
		}
	}
	return false
}
