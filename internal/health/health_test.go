package health

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

func TestReadinessFollowsRecovery(t *testing.T) {
	s := New()
	h := s.Handler()
	if code, _ := get(t, h, "/healthz"); code != 200 {
		t.Fatal("liveness must not depend on recovery")
	}
	for _, step := range []struct {
		status  Status
		ready   bool
		overall Status
	}{
		{Degraded, false, Degraded},
		{Unhealthy, false, Unhealthy},
		{Healthy, true, Healthy},
	} {
		s.Set(Recovery, step.status, "x")
		code, _ := get(t, h, "/readyz")
		if (code == 200) != step.ready || s.Ready() != step.ready {
			t.Fatalf("recovery %s: /readyz %d", step.status, code)
		}
		_, body := get(t, h, "/health")
		var r Report
		if err := json.Unmarshal([]byte(body), &r); err != nil || r.Status != step.overall {
			t.Fatalf("recovery %s: /health %s", step.status, body)
		}
	}
	s.Set("workers", Degraded, "1 worker could not be recovered")
	if r := s.Report(); r.Status != Degraded || r.Checks["workers"].Detail == "" || !s.Ready() {
		t.Fatalf("a broken worker degrades but keeps the node ready: %+v", r)
	}
}

// The API's State has no recovery: it is ready unless a gated check has
// been failing past its grace.
func TestEmptyStateIsReadyWithoutRecovery(t *testing.T) {
	s := NewEmpty()
	h := s.Handler()
	if code, body := get(t, h, "/readyz"); code != 200 {
		t.Fatalf("/readyz %d %s", code, body)
	}
	s.Set("temporal", Unhealthy, "down")
	s.GateReadiness("temporal", 0)
	if code, _ := get(t, h, "/readyz"); code == 200 {
		t.Fatal("ready with a gated check failing past its grace")
	}
}
