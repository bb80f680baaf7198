package dotnet

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Kept compilers (Config.KeptCompilers, DOTNET_KEPT_COMPILERS): a spare
// compiler that compiled a worker's source successfully is kept for that
// worker's next compile (a reload after an edit, a rollback to code no
// longer cached) instead of being killed: keptSettle later it resets
// mcs's static state, collects its garbage, stages the same compile again
// and waits (host/Compiler.cs, "again"). The worker's next compile takes
// it and leaves the spares alone, so no spare compiler starts in its
// place: a spare's start, Mono loading and warming mcs, is about 0.4 s of
// CPU, a kept compiler's staging 30–90 ms. A kept compiler only ever
// compiles sources of the worker it was kept for, in the same sandbox,
// under the same user id and limits as the spare it was (its CPU limit
// counts its whole life: the warm-up and at most keptCompiles compiles;
// its memory limit its whole address space: keptGrowth); one whose
// compile failed is not kept. At most Config.KeptCompilers are kept, the
// least recently used retired first, each for keptIdle after its last
// compile.

// keptCompiles bounds the compiles one kept compiler runs (its CPU limit
// and its memory count its whole life).
const keptCompiles = 8

// keptIdle is how long a kept compiler waits for its worker's next
// compile (Config.KeptCompilerIdle's default).
const keptIdle = time.Minute

// keptSettle is how long after its compile a kept compiler starts
// staging again (30–90 ms of CPU): a call back to back behind the one
// that compiled, which takes a spare anyway (the kept one would not be
// ready), runs without it beside.
const keptSettle = 150 * time.Millisecond

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
// its worker's kept compiler to be ready again (its staging, 30–90 ms)
// before it lets it go and waits for a spare or starts a compiler.
const keptWait = 250 * time.Millisecond

// keptCompilers are the compilers kept for their workers' next compile.
type keptCompilers struct {
	max  int
	idle time.Duration

	mu       sync.Mutex
	byWorker map[string]*kept
	closed   bool
}

// kept is one kept compiler.
type kept struct {
	sc    *spareCompiler
	rt    *runtime
	used  time.Time
	ready chan struct{} // closed once it has staged again (or failed to)
	timer *time.Timer   // retires it after idle
	// restage tells it to stage again (once), settle does so after
	// keptSettle.
	restage func()
	settle  *time.Timer
}

// keep keeps sc, which has just compiled worker's source with rt
// successfully (its assembly moved away), for worker's next compile. It
// reports false when sc is not kept (none are, the worker has no id, sc
// ran its last compile or is gone): the caller releases it.
func (k *keptCompilers) keep(worker string, rt *runtime, sc *spareCompiler) bool {
	if k == nil || k.max <= 0 || worker == "" || sc.Exited() {
		return false
	}
	sc.compiles++
	if sc.compiles >= keptCompiles {
		return false
	}
	c := &kept{sc: sc, rt: rt, used: time.Now(), ready: sc.output.rearm()}
	// It stages again keptSettle later (or when a compile waits for it),
	// not beside the rest of the call whose compile it just ran or a
	// call right behind it.
	c.restage = sync.OnceFunc(func() {
		// A compiler gone meanwhile: its exit says so to take.
		_, _ = sc.stdin.WriteString("again\n")
	})
	c.settle = time.AfterFunc(keptSettle, c.restage)
	var retire []*kept
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		c.settle.Stop()
		return false
	}
	if k.byWorker == nil {
		k.byWorker = map[string]*kept{}
	}
	if old := k.byWorker[worker]; old != nil {
		// Two compiles of one worker at once: the latest is kept.
		retire = append(retire, old)
		delete(k.byWorker, worker)
	}
	for len(k.byWorker) >= k.max {
		var lru string
		for w, o := range k.byWorker {
			if lru == "" || o.used.Before(k.byWorker[lru].used) {
				lru = w
			}
		}
		retire = append(retire, k.byWorker[lru])
		delete(k.byWorker, lru)
	}
	k.byWorker[worker] = c
	c.timer = time.AfterFunc(k.idle, func() { k.retireIdle(worker, c) })
	k.mu.Unlock()
	for _, o := range retire {
		o.stop()
	}
	return true
}

// stop retires c, which is no longer kept.
func (c *kept) stop() {
	c.timer.Stop()
	c.settle.Stop()
	c.sc.Release()
}

// retireIdle retires c, kept for worker, unless it was taken or
// replaced meanwhile.
func (k *keptCompilers) retireIdle(worker string, c *kept) {
	k.mu.Lock()
	still := k.byWorker[worker] == c
	if still {
		delete(k.byWorker, worker)
	}
	k.mu.Unlock()
	if still {
		c.stop()
	}
}

// take hands out worker's kept compiler for rt once it is ready again
// (waiting at most wait, and until ctx ends), or nil: none kept, or the
// one kept did not stage again in time or is gone (then retired). With
// wait 0 it hands out one ready now, and one still staging stays kept.
func (k *keptCompilers) take(ctx context.Context, worker string, rt *runtime, wait time.Duration) *spareCompiler {
	if k == nil || worker == "" {
		return nil
	}
	k.mu.Lock()
	c := k.byWorker[worker]
	if c != nil && c.rt == rt && wait == 0 {
		select {
		case <-c.ready:
		default:
			c = nil // staging still: it stays kept
		}
	}
	if c != nil {
		delete(k.byWorker, worker)
		c.timer.Stop()
	}
	k.mu.Unlock()
	if c == nil {
		return nil
	}
	if c.rt != rt {
		c.stop()
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

// ready returns the compilers kept now, by worker (tests).
func (k *keptCompilers) ready() map[string]*spareCompiler {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := map[string]*spareCompiler{}
	for w, c := range k.byWorker {
		out[w] = c.sc
	}
	return out
}

// close retires the kept compilers and keeps no more.
func (k *keptCompilers) close() {
	k.mu.Lock()
	all := k.byWorker
	k.byWorker, k.closed = nil, true
	k.mu.Unlock()
	for _, c := range all {
		c.stop()
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
