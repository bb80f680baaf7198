package native

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/procpool"
	"github.com/virtufin/workmanager/engines/internal/spares"
	"github.com/virtufin/workmanager/engines/native/internal/hostproto"
)

// Spare check hosts (Config.SpareCheckHosts, NATIVE_SPARE_CHECK_HOSTS;
// engines/internal/spares): with a sandbox, every Check of an uploaded
// package loads it in a sandboxed host first, so that its constructors
// never run in the node before it is known to load; starting that host
// (the sandbox's layers, the host's runtime) was most of a native create
// or reload. A spare is such a host started ahead of need with an empty
// package directory of its own, waiting (-await) for what to load: a
// Check extracts the package into that directory, gives it to the
// spare's user id, sends the load frame (the library and the worker's
// identity, set in the host's environment before the library's
// constructors run) and reads the answer. A spare checks one package,
// once: for an in-process worker it then exits; for a process-isolated
// worker it is parked for the Load that follows (park), which takes it as
// the worker's first host; a Load with no check before it (a start, a
// reconcile) takes a ready spare for its first host too (loadInSpare).
// It runs under a user id of its own, not its worker's, as a Python spare
// runner does.

// spareHost is a host waiting for one package to check.
type spareHost struct {
	p     *hostProc
	dir   string // its package directory (host path), bound at sandboxPackageDir
	owner string // its sandbox owner
}

// Exited implements spares.Proc.
func (s *spareHost) Exited() bool {
	select {
	case <-s.p.Done():
		return true
	default:
		return false
	}
}

// Healthy implements spares.Proc.
func (s *spareHost) Healthy() bool { return !s.p.killed.Load() }

// Retire implements spares.Proc: the host exits (EOF on its requests)
// and its directory is removed.
func (s *spareHost) Retire() {
	s.p.Retire()
	os.RemoveAll(s.dir)
}

// newSpareHosts keeps Config.SpareCheckHosts spares when the engine has a
// sandbox and a host (none otherwise: a Check then loads in process or
// in a host started for it).
func (e *Engine) newSpareHosts() *spares.Set[*spareHost] {
	want := e.cfg.SpareCheckHosts
	if e.cfg.Sandbox == nil || e.cfg.HostPath == "" {
		want = 0
	}
	return spares.New(want, e.cfg.Sandbox, e.startSpareHost, e.cfg.Logger, "native engine: a spare check host")
}

// startSpareHost starts a host for no package yet.
func (e *Engine) startSpareHost() (*spareHost, error) {
	dir, err := e.mkdir()
	if err != nil {
		return nil, fmt.Errorf("native engine: spare check host: %w", err)
	}
	owner := fmt.Sprintf("\x00native-check-%d", e.spareSeq.Add(1))
	p, err := e.spawnHost(engines.Spec{}, "", nil, dir, owner, e.cfg.Logger.With("spare", "native check host"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &spareHost{p: p, dir: dir, owner: owner}, nil
}

// checkInSpare checks pk in a spare host when one is ready (ok false:
// none was, nothing was done); the host is then parked for the Load
// (park).
func (e *Engine) checkInSpare(ctx context.Context, spec engines.Spec, pk *pkg, key procpool.Key) (ok bool, err error) {
	p, release, ok, err := e.loadInSpare(ctx, spec, pk)
	if !ok {
		return false, nil
	}
	e.spareChecks.Add(1)
	if err != nil {
		return true, err
	}
	e.park(spec, pk, key, p, release)
	return true, nil
}

// loadInSpare loads pk for spec's worker in a spare host when one is
// ready: p is that host, loaded, and release frees its package directory
// once p has exited (the caller's: park, or onExit). ok false: none was
// ready, or it was gone, and nothing was done.
func (e *Engine) loadInSpare(ctx context.Context, spec engines.Spec, pk *pkg) (p *hostProc, release func(), ok bool, err error) {
	s, ok, refill := e.spareHosts.TakeDeferred()
	defer refill()
	if !ok {
		return nil, nil, false, nil
	}
	kept := false // loaded: it owns its directory then
	defer func() {
		if !kept {
			s.Retire()
		}
	}()
	libPath, size, err := pk.extract(s.dir)
	if err == nil {
		if err = e.reserveDisk(s.dir, size); err == nil {
			defer func() {
				if !kept {
					e.releaseDisk(s.dir)
				}
			}()
		}
	}
	if err == nil {
		err = e.cfg.Sandbox.Own(s.dir, s.owner)
	}
	if err != nil {
		return nil, nil, true, err
	}
	rel, err := filepath.Rel(s.dir, libPath)
	if err != nil {
		return nil, nil, true, fmt.Errorf("native engine: %w", err)
	}
	frame, err := json.Marshal(hostproto.Load{Library: path.Join(sandboxPackageDir, filepath.ToSlash(rel)),
		Entry: pk.manifest.EntryPoint, Free: pk.manifest.FreeResult, ABIVersion: pk.manifest.ABIVersion,
		WorkerID: spec.WorkerID, Group: spec.Group, Topic: spec.Topic})
	if err != nil {
		return nil, nil, true, fmt.Errorf("native engine: %w", err)
	}
	if err := s.p.w.WriteFrame(hostproto.FrameLoad, frame); err != nil {
		// It died while it waited: nothing is done; a host of its own
		// does it.
		spec.Logger.Warn("native engine: a spare host was gone; starting a host of its own", "worker_id", spec.WorkerID, "error", err)
		return nil, nil, false, nil
	}
	if err := s.p.awaitLoad(ctx, e.cfg.LoadTimeout); err != nil {
		return nil, nil, true, err
	}
	kept = true
	return s.p, func() { e.releaseDisk(s.dir); os.RemoveAll(s.dir) }, true, nil
}
