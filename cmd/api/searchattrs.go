package main

import (
	"context"
	"log/slog"
	"time"

	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/virtufin/workmanager/internal/health"
	"github.com/virtufin/workmanager/internal/temporalconn"
)

// SearchAttributesCheck is the API's health check of the Temporal search
// attributes: Degraded, with the reason, from a failed registration until
// one succeeds (absent before the first try ends, a few milliseconds).
const SearchAttributesCheck = "search_attributes"

// registerSearchAttributes is the API's start-up step that registers the
// search attributes the worker workflows upsert (idempotent: it adds only
// the missing ones), tried again every retry until it succeeds. Until then
// the health check says why (Degraded: lifecycle calls fail when a
// workflow upserts an unregistered attribute) and every failure is logged.
func registerSearchAttributes(ctx context.Context, log *slog.Logger, op operatorservice.OperatorServiceClient, namespace string, hs *health.State, retry time.Duration) {
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := temporalconn.EnsureSearchAttributes(cctx, op, namespace)
		cancel()
		if err == nil {
			hs.Set(SearchAttributesCheck, health.Healthy, "registered in namespace "+namespace)
			log.Info("temporal search attributes registered", "namespace", namespace, "names", temporalconn.SearchAttributes)
			return
		}
		if ctx.Err() != nil {
			return
		}
		hs.Set(SearchAttributesCheck, health.Degraded, err.Error())
		log.Error("temporal search attributes: worker workflows fail to start until they are registered; trying again", "err", err, "retry", retry)
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
	}
}

// TemporalVersionCheck is the API's health check of the Temporal server's
// version: Degraded when it is older than temporalconn.MinServerVersion.
const TemporalVersionCheck = "temporal_version"

// checkTemporalVersion reports into hs whether the frontend's server is
// recent enough (asked once at start; an error asking is reported too).
func checkTemporalVersion(ctx context.Context, log *slog.Logger, ws workflowservice.WorkflowServiceClient, hs *health.State) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := temporalconn.CheckServerVersion(cctx, ws); err != nil {
		hs.Set(TemporalVersionCheck, health.Degraded, err.Error())
		log.Error("temporal server version", "err", err)
		return
	}
	hs.Set(TemporalVersionCheck, health.Healthy, "at least "+temporalconn.MinServerVersion+" (or not reported)")
}
