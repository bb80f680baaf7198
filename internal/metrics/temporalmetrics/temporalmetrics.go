// Package temporalmetrics exports the Temporal SDK's own metrics (requests,
// polls, workflow and activity task latencies, worker slots…) on the
// node's Prometheus registry, next to the workmanager_ metrics: the SDK
// reports through an OpenTelemetry meter (go.temporal.io/sdk/contrib/
// opentelemetry) whose reader is OpenTelemetry's Prometheus exporter.
//
// The names are the SDK's, with Prometheus suffixes: counters end in
// _total (temporal_request_total), timers are histograms in seconds
// (temporal_request_latency_seconds), gauges keep their name
// (temporal_num_pollers). They keep the temporal_ prefix, so Temporal's
// own dashboards for the Go SDK apply. It is a package of its own so that
// the hot path's packages (internal/metrics) do not link OpenTelemetry.
package temporalmetrics

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/otlptranslator"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.temporal.io/sdk/client"
	temporalotel "go.temporal.io/sdk/contrib/opentelemetry"

	"github.com/virtufin/workmanager/internal/metrics"
)

// Handler returns a metrics handler for client.Options.MetricsHandler whose
// metrics are gathered by reg, and the function that shuts its meter
// provider down. Errors of the meter (an instrument it cannot create) are
// logged, never fatal.
func Handler(reg prometheus.Registerer, log *slog.Logger) (client.MetricsHandler, func(context.Context) error, error) {
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo(),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes))
	if err != nil {
		return nil, nil, err
	}
	// The SDK's timers are in seconds: OpenTelemetry's default buckets
	// (0, 5, 10, 25 … 10000) are made for milliseconds.
	seconds := sdkmetric.NewView(sdkmetric.Instrument{Kind: sdkmetric.InstrumentKindHistogram},
		sdkmetric.Stream{Aggregation: sdkmetric.AggregationExplicitBucketHistogram{Boundaries: metrics.LatencyBuckets}})
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithView(seconds))
	h := temporalotel.NewMetricsHandler(temporalotel.MetricsHandlerOptions{
		Meter:                mp.Meter("temporal-sdk-go"),
		UseMonotonicCounters: true, // counters, not gauges, in Prometheus
		OnError:              func(err error) { log.Warn("temporal metrics", "err", err) },
	})
	return h, mp.Shutdown, nil
}
