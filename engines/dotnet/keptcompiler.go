package dotnet

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/virtufin/workmanager/engines/lull"
)

// Kept compilers (Config.KeptCompilers, DOTNET_KEPT_COMPILERS): a spare
// compiler that compiled a worker's source successfully is kept for the
// next compile of its owner — the worker's tenant (Spec.Tenant), or the
// worker itself when the spec names no tenant — instead of being killed:
// once the node's calls pause (keptSettle) it resets mcs's static state,
// collects its garbage, stages the same compile again, preloads and waits
// (host/Compiler.cs, "again").
// The owner's next compile (a reload after an edit, a rollback to code no
// longer cached, the tenant's next create) takes it and leaves the spares
// alone, so no spare compiler starts in its place: a spare's start, Mono
// loading and warming mcs, is about 0.4 s of CPU, a kept compiler's
// staging and preload 160–240 ms. At most keptPerOwner are kept for one owner, so that
// calls back to back (a create and the reload right behind it, whose
// compiler is still staging) find one ready. A kept compiler only ever
// compiles sources of its owner — one tenant's: the sources it compiles
// come from one party, and mcs runs none of them — in the same sandbox,
// under the same user id and limits as the spare it was (its CPU limit
// counts its whole life: the warm-up and at most keptCompiles compiles;
// its memory limit its whole address space: keptGrowth); one whose
// compile failed is not kept. At most Config.KeptCompilers are kept in
// all, the least recently used retired first, each for keptIdle after its
// last compile.

// keptCompiles bounds the compiles one kept compiler runs (its CPU limit
// and its memory count its whole life).
const keptCompiles = 8

// keptPerOwner bounds the compilers kept for one owner: one for the call
// that comes next and one for the call right behind it.
const keptPerOwner = 2

// keptIdle is how long a kept compiler waits for its owner's next
// compile (Config.KeptCompilerIdle's default).
const keptIdle = time.Minute

// keptSettle is how long after its compile, and after the node's last
// call (lull.Node), a kept compiler starts staging again: the staging
// and the preload that follows it are 160–240 ms of CPU (measured on
// make run, two cores), which calls back to back behind the one that
// compiled (a reload, a stop, a start, 20–50 ms apart) would otherwise
// run beside. keptSettleMax bounds the wait under calls that never
// pause; a compile that needs the compiler meanwhile stages it at once
// (take).
const (
	keptSettle    = 100 * time.Millisecond
	keptSettleMax = time.Second
)

// keptGrowth bounds how much more address space than when it was first
// ready a kept compiler may hold and still be used: the compiler's
// memory limit bounds the address space of its whole process, so each
// compile on a kept compiler has that much less of it than on a spare
// just started. Measured: a spare 233 MiB when ready, 249 once its
// preload ran, 272 after its first compile of a worker using LINQ and
// async, and no more over 7 compiles (the compiler collects its garbage
// before it stages again): 23 MiB less than on a preloaded spare.
const keptGrowth = 64 << 20

// keptWait bounds how long a compile that found no spare ready waits for
// its owner's kept compiler to be ready again (told to stage at once: its
// staging and preload, 160–240 ms of CPU, ready once the staging is done)
// before it lets it go and waits for a spare or starts a compiler.
const keptWait = 250 * time.Millisecond

// keptOwner is whose kept compilers a compile of worker, of tenant, may
// take: the tenant's ("" : the worker's own). Worker ids never hold a
// NUL, so a tenant's key is never a worker's.
func keptOwner(tenant, worker string) string {
	if tenant == "" {
		return worker
	}
	return "\x00tenant\x00" + tenant
}

// keptCompilers are the compilers kept for their owners' next compiles.
type keptCompilers struct {
	max  int
	idle time.Duration

	mu sync.Mutex
	// byOwner are the compilers kept for each owner, the most recently
	// kept last; n counts them all.
	byOwner map[string][]*kept
	n       int
	closed  bool
}

// kept is one kept compiler.
type kept struct {
	sc    *spareCompiler
	rt    *runtime
	used  time.Time
	ready chan struct{} // closed once it has staged again (or failed to)
	timer *time.Timer   // retires it after idle
	// restage tells it to stage again (once), settle does so after a
	// lull (keptSettle).
	restage func()
	settle  *lull.Timer
}

// keep keeps sc, which has just compiled a source of owner's with rt
// successfully (its assembly moved away), for owner's next compile. It
// reports false when sc is not kept (none are, no owner, sc ran its last
// compile or is gone): the caller releases it.
func (k *keptCompilers) keep(owner string, rt *runtime, sc *spareCompiler) bool {
	if k == nil || k.max <= 0 || owner == "" || sc.Exited() {
		return false
	}
	sc.compiles++
	if sc.compiles >= keptCompiles {
		return false
	}
	c := &kept{sc: sc, rt: rt, used: time.Now(), ready: sc.output.rearm()}
	// It stages again once the node's calls pause (or when a compile
	// waits for it), not beside the rest of the call whose compile it
	// just ran or the calls right behind it.
	c.restage = sync.OnceFunc(func() {
		// A compiler gone meanwhile: its exit says so to take.
		_, _ = sc.stdin.WriteString("again\n")
	})
	c.settle = lull.Node.After(keptSettle, keptSettleMax, c.restage)
	var retire []*kept
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		c.settle.Stop()
		return false
	}
	if k.byOwner == nil {
		k.byOwner = map[string][]*kept{}
	}
	if l := k.byOwner[owner]; len(l) >= keptPerOwner {
		// The owner's least recently kept makes room.
		retire = append(retire, l[0])
		k.removeLocked(owner, l[0])
	}
	for k.n >= k.max {
		lruOwner, lru := "", (*kept)(nil)
		for o, l := range k.byOwner {
			if lru == nil || l[0].used.Before(lru.used) {
				lruOwner, lru = o, l[0]
			}
		}
		retire = append(retire, lru)
		k.removeLocked(lruOwner, lru)
	}
	k.byOwner[owner] = append(k.byOwner[owner], c)
	k.n++
	c.timer = time.AfterFunc(k.idle, func() { k.retireIdle(owner, c) })
	k.mu.Unlock()
	for _, o := range retire {
		o.stop()
	}
	return true
}

// removeLocked removes c from owner's kept compilers, reporting whether
// it was there (k.mu held).
func (k *keptCompilers) removeLocked(owner string, c *kept) bool {
	l := k.byOwner[owner]
	for i, o := range l {
		if o == c {
			l = append(l[:i:i], l[i+1:]...)
			if len(l) == 0 {
				delete(k.byOwner, owner)
			} else {
				k.byOwner[owner] = l
			}
			k.n--
			return true
		}
	}
	return false
}

// stop retires c, which is no longer kept.
func (c *kept) stop() {
	c.timer.Stop()
	c.settle.Stop()
	c.sc.Release()
}

// retireIdle retires c, kept for owner, unless it was taken or retired
// meanwhile.
func (k *keptCompilers) retireIdle(owner string, c *kept) {
	k.mu.Lock()
	still := k.removeLocked(owner, c)
	k.mu.Unlock()
	if still {
		c.stop()
	}
}

// take hands out one of owner's kept compilers for rt once it is ready
// again (waiting at most wait, and until ctx ends), or nil: none kept, or
// the one taken did not stage again in time or is gone (then retired).
// With wait 0 it hands out one ready now (the most recently kept of
// those), and those still staging stay kept; with a wait, one ready now
// or else the one that started staging first. Compilers kept for another
// runtime (the engine's was rebuilt) are retired.
func (k *keptCompilers) take(ctx context.Context, owner string, rt *runtime, wait time.Duration) *spareCompiler {
	if k == nil || owner == "" {
		return nil
	}
	var (
		c      *kept
		retire []*kept
	)
	k.mu.Lock()
	for _, o := range slices.Clone(k.byOwner[owner]) {
		if o.rt != rt {
			k.removeLocked(owner, o)
			retire = append(retire, o)
		}
	}
	l := k.byOwner[owner]
	for i := len(l) - 1; i >= 0 && c == nil; i-- {
		if isClosed(l[i].ready) {
			c = l[i]
		}
	}
	if c == nil && wait > 0 && len(l) > 0 {
		c = l[0]
	}
	if c != nil {
		k.removeLocked(owner, c)
		c.timer.Stop()
	}
	k.mu.Unlock()
	for _, o := range retire {
		o.stop()
	}
	if c == nil {
		return nil
	}
	c.restage() // now, if it is still settling
	// Ready now (always, with wait 0) or once it stages again.
	select {
	case <-c.ready:
	default:
		timer := time.NewTimer(wait)
		defer timer.Stop()
		select {
		case <-c.ready:
		case <-c.sc.done:
		case <-timer.C:
		case <-ctx.Done():
		}
	}
	if isClosed(c.ready) && !c.sc.Exited() && addressSpace(c.sc.cmd.Process.Pid) <= c.sc.readyVM+keptGrowth {
		return c.sc
	}
	c.stop()
	return nil
}

// isClosed reports whether ch is closed.
func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// ready returns the compiler kept most recently for each owner now
// (tests).
func (k *keptCompilers) ready() map[string]*spareCompiler {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := map[string]*spareCompiler{}
	for o, l := range k.byOwner {
		out[o] = l[len(l)-1].sc
	}
	return out
}

// keptFor returns the compilers kept for owner now, the most recently
// kept last (tests).
func (k *keptCompilers) keptFor(owner string) []*spareCompiler {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []*spareCompiler
	for _, c := range k.byOwner[owner] {
		out = append(out, c.sc)
	}
	return out
}

// close retires the kept compilers and keeps no more.
func (k *keptCompilers) close() {
	k.mu.Lock()
	all := k.byOwner
	k.byOwner, k.n, k.closed = nil, 0, true
	k.mu.Unlock()
	for _, l := range all {
		for _, c := range l {
			c.stop()
		}
	}
}

// addressSpace is the largest address space (VmSize) of process pid and
// the processes under it (a sandbox's launchers and Mono), in bytes; 0
// when it cannot be read.
func addressSpace(pid int) uint64 {
	var most uint64
	for _, p := range processTree(pid) {
		most = max(most, procKiB(p, "status", "VmSize:"))
	}
	return most
}

// procKiB is the value, in bytes, of the line of /proc/<pid>/<file> that
// starts with field and counts kB ("VmSize:", "Pss:"); 0 when there is
// none.
func procKiB(pid int, file, field string) uint64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field {
			if kb, err := strconv.ParseUint(f[1], 10, 64); err == nil {
				return kb << 10
			}
		}
	}
	return 0
}

// maxTree bounds processTree (a sandboxed compiler's tree is three deep:
// bubblewrap's two processes and Mono).
const maxTree = 16

// processTree is pid and the processes under it, breadth first, from the
// kernel's lists of children, at most maxTree of them.
func processTree(pid int) []int {
	tree := []int{pid}
	for i := 0; i < len(tree) && len(tree) < maxTree; i++ {
		children, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", tree[i], tree[i]))
		for _, f := range strings.Fields(string(children)) {
			if c, err := strconv.Atoi(f); err == nil && len(tree) < maxTree {
				tree = append(tree, c)
			}
		}
	}
	return tree
}
