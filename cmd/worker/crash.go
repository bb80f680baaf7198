package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/virtufin/workmanager/engines/crashjournal"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/node"
)

// openCrashJournal opens the node's crash journal (NODE_STATE_DIR) and logs,
// before anything else, the in-process native calls a crash of the node
// before this one left in flight. A journal that cannot be opened costs the
// crash accounting, not the node (nil journal: none).
func openCrashJournal(log *slog.Logger, cfg config) (*crashjournal.Journal, crashjournal.Report) {
	j, rep, err := crashjournal.Open(cfg.NodeStateDir, crashjournal.Options{Slots: cfg.NativeJournalSlots, Quarantine: cfg.NativeCrashQuarantine,
		CrashOutput: true})
	if err != nil {
		log.Error("crash journal off: a native worker that crashes this node will not be named, its event not dead-lettered as crashed, nor the worker quarantined", "err", err)
		return nil, rep
	}
	for _, c := range rep.InFlight {
		if rep.Killed {
			log.Warn("the node was killed from outside while an in-process native worker ran an event; not counted as its crash", "worker_id", c.Worker,
				"event_id", c.Event)
			continue
		}
		log.Error("the node crashed while an in-process native worker ran an event (crash journal)", "worker_id", c.Worker, "event_id", c.Event,
			"crash", rep.CrashReport, "journal", cfg.NodeStateDir)
	}
	for _, e := range rep.Suspects {
		log.Warn("event crashed the node repeatedly: it is dead-lettered as crashed, not run again", "worker_id", e.Worker, "event_id", e.Event,
			"crashes", e.Crashes)
	}
	return j, rep
}

// suspect is the dispatcher's Config.Suspect (nil without a journal, so
// that the hot path asks nothing).
func suspect(j *crashjournal.Journal) func(worker, source, id string) bool {
	if j == nil {
		return nil
	}
	return j.Suspect
}

// quarantineCrashed quarantines the workers the journal reports (they
// crashed the node NATIVE_CRASH_QUARANTINE times): at once on this node,
// before anything is loaded, and cluster-wide (catalog.SetQuarantine, tried
// until it is written) with an error lifecycle event that says why; then
// their count starts over.
func quarantineCrashed(ctx context.Context, log *slog.Logger, rep crashjournal.Report, j *crashjournal.Journal, n *node.Node,
	cat *catalog.Catalog, events *lifecycleevents.Emitter, nodeID string) {
	n.OnQuarantineLifted(func(id string) {
		if err := j.Forget(id); err != nil {
			log.Warn("crash journal: the lifted worker's counts are kept", "worker_id", id, "err", err)
		}
	})
	for id, c := range rep.Quarantine {
		q := catalog.Quarantine{Crashes: c.Crashes, LastEvent: c.LastEvent, Node: nodeID, At: c.LastAt}
		n.Quarantine(id, q)
		log.Error("worker quarantined: it crashed the node repeatedly; no node loads it until LoadCode or StartWorker",
			"worker_id", id, "crashes", c.Crashes, "last_event", c.LastEvent)
		go func() {
			for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
				err := cat.SetQuarantine(ctx, id, q)
				if err == nil {
					break
				}
				log.Warn("worker quarantine not recorded yet; trying again", "worker_id", id, "err", err, "in", wait)
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
			}
			n.QuarantineRecorded(id)
			if err := j.Quarantined(id); err != nil {
				log.Warn("crash journal: the quarantined worker's count is kept", "worker_id", id, "err", err)
			}
			d := lifecycleevents.Data{WorkerID: id, ErrorType: "quarantined", ErrorMessage: q.Reason(), EventID: q.LastEvent}
			if w, err := cat.GetWorker(ctx, id); err == nil {
				d.Topic, d.Group, d.WorkerName = w.Topic, w.Group, w.Name
			}
			evID := "quarantine-" + id + "-" + q.At.UTC().Format("20060102T150405.000000000")
			if err := events.Emit(ctx, evID, lifecycleevents.Error, d); err != nil {
				log.Warn("quarantine lifecycle event not published", "worker_id", id, "err", err)
			}
		}()
	}
}
