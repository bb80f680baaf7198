package temporalmetrics

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The SDK's counters, gauges and timers reach the registry under their
// own names with Prometheus suffixes, timers as histograms in seconds.
func TestSDKMetricsReachTheRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	h, stop, err := Handler(reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer stop(context.Background())
	tagged := h.WithTags(map[string]string{"namespace": "default", "operation": "StartWorkflowExecution"})
	tagged.Counter("temporal_request").Inc(2)
	tagged.Timer("temporal_request_latency").Record(30 * time.Millisecond)
	h.Gauge("temporal_num_pollers").Update(3)

	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	req := byName["temporal_request_total"]
	if req == nil || req.GetType() != dto.MetricType_COUNTER || req.Metric[0].GetCounter().GetValue() != 2 {
		t.Fatalf("temporal_request_total: %v (families %v)", req, names(fams))
	}
	labels := map[string]string{}
	for _, l := range req.Metric[0].Label {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["namespace"] != "default" || labels["operation"] != "StartWorkflowExecution" {
		t.Errorf("labels %v, want the handler's tags", labels)
	}
	lat := byName["temporal_request_latency_seconds"]
	if lat == nil || lat.GetType() != dto.MetricType_HISTOGRAM {
		t.Fatalf("temporal_request_latency_seconds: %v (families %v)", lat, names(fams))
	}
	hist := lat.Metric[0].GetHistogram()
	if hist.GetSampleCount() != 1 || hist.GetSampleSum() < 0.029 || hist.GetSampleSum() > 0.031 {
		t.Errorf("latency histogram: %d samples, sum %v", hist.GetSampleCount(), hist.GetSampleSum())
	}
	if b := hist.GetBucket(); len(b) == 0 || b[0].GetUpperBound() != 0.0005 {
		t.Errorf("buckets %v, want the seconds buckets of internal/metrics", b)
	}
	if g := byName["temporal_num_pollers"]; g == nil || g.GetType() != dto.MetricType_GAUGE || g.Metric[0].GetGauge().GetValue() != 3 {
		t.Errorf("temporal_num_pollers: %v", g)
	}
}

func names(fams []*dto.MetricFamily) []string {
	var out []string
	for _, f := range fams {
		out = append(out, f.GetName())
	}
	return out
}
