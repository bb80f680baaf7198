package main

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/virtufin/workmanager/internal/health"
	"github.com/virtufin/workmanager/internal/metrics"
)

// The node's HTTP server serves /metrics next to the health endpoints.
func TestHTTPHandlerServesMetricsAndHealth(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	m.Worker("w1", "python", "", 4).Received.Inc()
	srv := httptest.NewServer(httpHandler(health.New(), reg, slog.New(slog.NewTextHandler(io.Discard, nil))))
	defer srv.Close()

	get := func(path string) (int, string, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	code, ctype, body := get("/metrics")
	if code != http.StatusOK || !strings.HasPrefix(ctype, "text/plain") ||
		!strings.Contains(body, `workmanager_worker_messages_received_total{engine="python",worker_id="w1"} 1`) {
		t.Fatalf("/metrics: %d %s\n%s", code, ctype, body)
	}
	if code, _, body := get("/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if code, _, _ := get("/health"); code != http.StatusOK {
		t.Fatalf("/health: %d", code)
	}
	resp, err := http.Post(srv.URL+"/metrics", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Fatal("POST /metrics answered 200, want only GET")
	}
}
