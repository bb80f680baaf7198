package dotnet

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/childproc"
)

// Spare hosts (Config.Spares, DOTNET_SPARE_HOSTS; engines/internal/spares):
// hosts started ahead of need, past their hello, for no worker yet, so
// that a create, a start or a reload takes one instead of starting the
// runtime inside the sandbox. A host reads its worker's files from a
// directory bound read-only into its sandbox at its start; a spare's is an
// empty slot of its own (<cache>/spares/owner-*/slot-*, slots.go), into which the worker's
// files are hard-linked when it is taken, so that it sees that worker's
// files and no other's. It then gets the worker's VIRTUFIN_WORKER_*
// variables (a setup frame) and the load request, with the paths under the
// slot. A spare is given to one worker, once, and never given back; it runs
// under a user id of its own (the sandbox's anonymous lease); its slot is
// removed when it exits.

// spareHostWait bounds how long a host start waits for a spare being
// started (40–55 ms from its start, strict sandbox, two idle cores) before
// it starts a host itself.
const spareHostWait = 150 * time.Millisecond

// takeSpare returns a ready spare host (or, none ready, the one being
// started: spares.Set.TakeAwaiting) given to spec's worker, w moved
// into its slot (onSlot) and the setup payload with the worker's
// variables; a nil host when none is ready (Config.Spares 0: never) or the
// one taken could not take the worker (then retired). Either way the next
// ones start in the background once the caller calls refill (when its
// host is loaded).
func (e *Engine) takeSpare(ctx context.Context, spec engines.Spec, w *workerCode) (*proc, *workerCode, []byte, func()) {
	p, ok, refill := e.spares.TakeAwaiting(ctx, spareHostWait)
	if !ok {
		return nil, nil, nil, refill
	}
	setup, ok := setupPayload(spec)
	if !ok {
		p.Retire()
		return nil, nil, nil, refill
	}
	onSpare, err := onSlot(p, w)
	if err != nil {
		spec.Logger.Warn("dotnet engine: a spare host could not take the worker's files; starting a host for it", "worker_id", spec.WorkerID, "error", err)
		p.Retire()
		return nil, nil, nil, refill
	}
	p.Adopt(spec, childproc.Names{Engine: "dotnet", Process: "host"})
	return p, onSpare, setup, refill
}

// currentRuntime is the runtime built by the first Check or Load (nil
// before).
func (e *Engine) currentRuntime() *runtime {
	e.rtMu.Lock()
	defer e.rtMu.Unlock()
	return e.rt
}

// startSpare starts a host for no worker yet, on an empty slot, and reads
// its hello.
func (e *Engine) startSpare() (*proc, error) {
	rt := e.currentRuntime()
	if rt == nil {
		return nil, fmt.Errorf("dotnet engine: spare host: no runtime yet")
	}
	slot, err := e.newSlot("spares")
	if err != nil {
		return nil, fmt.Errorf("dotnet engine: spare host: %w", err)
	}
	p, err := e.spawn(engines.Spec{Logger: e.cfg.Logger}, rt, slot, true, func() { os.RemoveAll(slot) })
	if err != nil {
		return nil, err
	}
	p.slot = slot
	if err := p.AwaitHello(p.readFrame, e.cfg.LoadTimeout); err != nil {
		p.Retire()
		return nil, fmt.Errorf("dotnet engine: spare host: %w", err)
	}
	return p, nil
}

// onSlot gives spare p the files of w (hard links in its slot, copies
// where a link cannot be made) and returns w with its paths in the slot.
func onSlot(p *proc, w *workerCode) (*workerCode, error) {
	if err := linkTree(w.dir, p.slot); err != nil {
		return nil, fmt.Errorf("dotnet engine: spare host: %w", err)
	}
	move := func(paths []string) []string {
		out := make([]string, len(paths))
		for i, path := range paths {
			if rel, err := filepath.Rel(w.dir, path); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
				path = filepath.Join(p.slot, rel)
			}
			out[i] = path
		}
		return out
	}
	return &workerCode{assemblies: move(w.assemblies), probe: move(w.probe), dir: p.slot}, nil
}

// linkTree makes dst (an existing, empty directory) hold src's directories
// and regular files, each file a hard link or else a copy; anything else
// in src (a symbolic link) is an error.
func linkTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil || rel == "." {
			return err
		}
		to := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.Mkdir(to, 0o755)
		case d.Type().IsRegular():
			if os.Link(path, to) == nil {
				return nil
			}
			return copyFile(path, to)
		default:
			return fmt.Errorf("%s is not a regular file or a directory", path)
		}
	})
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// setupPayload is what gives a spare host spec's variables (a setup frame):
// KEY=VALUE lines of the VIRTUFIN_WORKER_* variables. ok is false when a
// value cannot go on a line (then no spare is used).
func setupPayload(spec engines.Spec) ([]byte, bool) {
	var b strings.Builder
	for _, kv := range childproc.Env(spec, nil) {
		if !strings.HasPrefix(kv, "VIRTUFIN_WORKER_") {
			continue
		}
		if strings.ContainsAny(kv, "\n\x00") {
			return nil, false
		}
		b.WriteString(kv)
		b.WriteByte('\n')
	}
	return []byte(b.String()), true
}
