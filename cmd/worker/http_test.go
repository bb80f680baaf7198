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
	m.Worker("w1", "pricer", "python", "", 4).Received.Inc()
	srv := httptest.NewServer(httpHandler(health.New(), reg, slog.New(slog.NewTextHandler(io.Discard, nil)), false, http.NotFoundHandler(), nil))
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
		!strings.Contains(body, `workmanager_worker_messages_received_total{engine="python",worker_id="w1",worker_name="pricer"} 1`) {
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

// Go's profiles are served only with DEBUG_PPROF: off, /debug/pprof/ is the
// health handler's 404; on, a heap profile comes back.
func TestHTTPHandlerServesProfilesOnlyWhenAsked(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, on := range []bool{false, true} {
		srv := httptest.NewServer(httpHandler(health.New(), prometheus.NewRegistry(), log, on, http.NotFoundHandler(), nil))
		resp, err := http.Get(srv.URL + "/debug/pprof/heap?debug=1")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.Close()
		if served := resp.StatusCode == http.StatusOK && strings.Contains(string(b), "heap profile"); served != on {
			t.Fatalf("DEBUG_PPROF %v: /debug/pprof/heap answered %d %.80q", on, resp.StatusCode, b)
		}
	}
}
