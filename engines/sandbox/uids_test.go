package sandbox

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Two live owners never hold one id; ids come back when released.
func TestUIDAllocatorUniqueAndReleased(t *testing.T) {
	a := newUIDAllocator(1000, 2)
	ua, relA, err := a.acquire("a")
	if err != nil {
		t.Fatal(err)
	}
	ua2, relA2, _ := a.acquire("a")
	ub, relB, err := a.acquire("b")
	if err != nil {
		t.Fatal(err)
	}
	if ua != ua2 || ua == ub || ua < 1000 || ua > 1001 || ub < 1000 || ub > 1001 {
		t.Fatalf("a %d and %d, b %d; want one id per owner in 1000..1001", ua, ua2, ub)
	}
	if _, _, err := a.acquire("c"); err == nil || !strings.Contains(err.Error(), "all 2 worker user ids") {
		t.Fatalf("a third owner with two ids: %v", err)
	}
	relA()
	relA() // a second call does nothing
	if u, ok := a.current("a"); !ok || u != ua {
		t.Fatalf("a holds %d %v after one of two releases; want %d", u, ok, ua)
	}
	relA2()
	if _, ok := a.current("a"); ok {
		t.Fatal("a still holds an id after its last release")
	}
	uc, relC, err := a.acquire("c")
	if err != nil || uc != ua {
		t.Fatalf("c got %d %v; want a's released id %d", uc, err, ua)
	}
	relC()
	relB()
	if len(a.held) != 0 || len(a.leases) != 0 {
		t.Fatalf("held %v after every release", a.held)
	}
}

// A worker gets the same id on every node (each node has its own
// allocator) and after its processes restart; two workers whose preferred
// ids are the same get different ones on one node.
func TestUIDAllocatorPrefersAStableID(t *testing.T) {
	nodeA, nodeB := newUIDAllocator(200000, 50000), newUIDAllocator(200000, 50000)
	_, relOther, _ := nodeB.acquire("someone-else") // node B's history differs
	defer relOther()
	ua, relA, _ := nodeA.acquire("worker-1")
	ub, relB, _ := nodeB.acquire("worker-1")
	if ua != ub {
		t.Fatalf("worker-1 has %d on node A and %d on node B; want one id", ua, ub)
	}
	relA()
	relB()
	if u, rel, _ := nodeA.acquire("worker-1"); u != ua {
		t.Fatalf("worker-1 restarted with %d; want %d again", u, ua)
	} else {
		rel()
	}
	// Two names with one preferred id (found by search in a small range).
	small := newUIDAllocator(0, 16)
	first := "w0"
	second := ""
	for i := 1; second == ""; i++ {
		if name := "w" + strconv.Itoa(i); small.preferred(name) == small.preferred(first) {
			second = name
		}
	}
	u1, rel1, _ := small.acquire(first)
	u2, rel2, _ := small.acquire(second)
	if u1 == u2 {
		t.Fatalf("%s and %s share %d", first, second, u1)
	}
	rel1()
	rel2()
}

// An owner keeps the id of the files it was given (Own) while they exist.
func TestUIDAllocatorPins(t *testing.T) {
	a := newUIDAllocator(0, 1)
	dir := filepath.Join(t.TempDir(), "pkg")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	u, rel, _ := a.acquire("owner")
	a.pin("owner", dir)
	rel()
	if _, _, err := a.acquire("other"); err == nil {
		t.Fatal("another owner got the id of files that still exist")
	}
	if got, rel, _ := a.acquire("owner"); got != u {
		t.Fatalf("owner came back to %d; want %d", got, u)
	} else {
		rel()
	}
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if got, rel, err := a.acquire("other"); err != nil || got != u {
		t.Fatalf("after the files went: %d %v", got, err)
	} else {
		rel()
	}
}

// Concurrent acquires and releases (run with -race): at every moment each
// id is held by one owner at most, and every id comes back.
func TestUIDAllocatorConcurrent(t *testing.T) {
	const ids, owners, goroutines, rounds = 24, 40, 16, 300
	a := newUIDAllocator(5000, ids)
	var mu sync.Mutex
	holder := map[int]string{}
	holds := map[string]int{}
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for i := 0; i < rounds; i++ {
				owner := "w" + strconv.Itoa(r.IntN(owners))
				if i%7 == 0 {
					owner = "" // a process of no worker
				}
				uid, release, err := a.acquire(owner)
				if err != nil {
					t.Error(err)
					return
				}
				key := owner
				if key == "" {
					key = "anon-" + strconv.Itoa(g) + "-" + strconv.Itoa(i)
				}
				mu.Lock()
				if h, ok := holder[uid]; ok && h != key {
					t.Errorf("uid %d held by %q and %q at once", uid, h, key)
				}
				holder[uid] = key
				holds[key]++
				mu.Unlock()
				mu.Lock()
				holds[key]--
				if holds[key] == 0 {
					delete(holder, uid)
					delete(holds, key)
				}
				// Released under mu so that the next holder is recorded
				// after this one is forgotten.
				release()
				mu.Unlock()
			}
		}(g)
	}
	wg.Wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.leases) != 0 || len(a.held) != 0 {
		t.Fatalf("after every release: %d leases, %d ids held", len(a.leases), len(a.held))
	}
}
