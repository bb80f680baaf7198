package python_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/python"
)

// TestWorkerLoggingKeepsItsLevel (issue 44 item 4): a worker's
// logging.info is not lost (Python's root logger is at WARNING by default),
// each record reaches the node's log at its own level with its logger's
// name, a traceback's lines at the record's level, and the worker may
// choose its level like any program (logging.getLogger().setLevel).
func TestWorkerLoggingKeepsItsLevel(t *testing.T) {
	rec := &recorder{}
	e := newEngine(t, python.Config{})
	spec := testSpec
	spec.Logger = slog.New(rec)
	inst := load(t, e, spec, `
import logging
log = logging.getLogger("pricer")
logging.info("loaded at info")
logging.debug("hidden at load")

def process(event):
    if event["data"] == "debug":
        logging.getLogger().setLevel(logging.DEBUG)
    log.debug("debug %s", event["id"])
    log.info("info %s", event["id"])
    log.warning("warning %s", event["id"])
    try:
        1 / 0
    except ZeroDivisionError:
        log.exception("failed %s", event["id"])
    print("printed", event["id"])
    return None
`)
	mustCall(t, inst, enginetest.NewEvent("e1", "t", "info", ""))
	mustCall(t, inst, enginetest.NewEvent("e2", "t", "debug", ""))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := inst.Close(ctx); err != nil { // flushes the logs
		t.Fatal(err)
	}
	rec.mu.Lock()
	var got []string
	for _, r := range rec.records {
		logger := ""
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "logger" {
				logger = a.Value.String()
			}
			return true
		})
		got = append(got, r.Level.String()+"|"+logger+"|"+r.Message)
	}
	rec.mu.Unlock()
	for _, w := range []string{
		"INFO||loaded at info",
		"INFO|pricer|info e1", "WARN|pricer|warning e1", "ERROR|pricer|failed e1", "ERROR|pricer|ZeroDivisionError: division by zero",
		"INFO||printed e1",
		"DEBUG|pricer|debug e2", "INFO|pricer|info e2",
	} {
		if !slices.Contains(got, w) {
			t.Errorf("no record %q in:\n%q", w, got)
		}
	}
	for _, never := range []string{"DEBUG||hidden at load", "DEBUG|pricer|debug e1"} {
		if slices.Contains(got, never) {
			t.Errorf("record %q below the worker's level", never)
		}
	}
}
