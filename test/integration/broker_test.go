package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/health"
)

// healthReport reads the node's /health.
func (e *env) healthReport(t *testing.T) health.Report {
	t.Helper()
	var r health.Report
	if err := json.Unmarshal([]byte(e.httpGet(t, "/health")), &r); err != nil {
		t.Fatalf("/health: %v", err)
	}
	return r
}

// readyz returns /readyz's status code and body.
func (e *env) readyz(t *testing.T) (int, string) {
	t.Helper()
	resp, err := http.Get(e.nodeURL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	n, _ := resp.Body.Read(buf)
	b.Write(buf[:n])
	return resp.StatusCode, b.String()
}

// Issue 6, done when: publishing fails (the broker stopped), /health turns
// Degraded with the reason and /readyz fails after the grace; both recover
// by themselves when the broker returns, and no message is lost.
func TestHealthTracksBrokerOutage(t *testing.T) {
	e := newEnvWith(t, envConfig{nodeEnv: []string{"BROKER_PROBE_INTERVAL=500ms", "BROKER_READY_GRACE=3s"}})
	in, out := topicName(t, "in"), topicName(t, "out")
	e.create(t, in, echoWorker(out, "v1"))
	o := &outputs{t: t, ch: e.subscribe(out), seen: map[string]bool{}}
	waitFor(t, 15*time.Second, "broker Healthy", func() bool { return e.healthReport(t).Checks[health.Broker].Status == health.Healthy })

	// Inputs published just before the outage: some are in flight when it
	// starts, and their outputs cannot be published.
	var before []string
	for _, id := range []string{"b1", "b2", "b3", "b4", "b5"} {
		e.publish(in, id, map[string]any{"n": id}, "")
		before = append(before, id)
	}
	e.stack.StopRedis()

	var detail string
	waitFor(t, 15*time.Second, "broker Degraded", func() bool {
		c := e.healthReport(t).Checks[health.Broker]
		detail = c.Detail
		return c.Status == health.Degraded && strings.Contains(c.Detail, "publish failing")
	})
	t.Logf("broker check while Redis is down: %s", detail)
	if r := e.healthReport(t); r.Status == health.Healthy {
		t.Fatalf("overall status Healthy while the broker is down: %+v", r)
	}
	var body string
	waitFor(t, 20*time.Second, "/readyz failing after the grace", func() bool {
		var code int
		code, body = e.readyz(t)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "broker")
	})
	t.Logf("/readyz while Redis is down: %s", strings.TrimSpace(body))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.stack.StartRedis(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "broker Healthy again", func() bool {
		return e.healthReport(t).Checks[health.Broker].Status == health.Healthy
	})
	waitFor(t, 10*time.Second, "/readyz passing again", func() bool { code, _ := e.readyz(t); return code == http.StatusOK })

	after := []string{"a1", "a2", "a3"}
	for _, id := range after {
		e.publish(in, id, map[string]any{"n": id}, "")
	}
	// Every input is answered: those caught by the outage come back through
	// redelivery (processingTimeout 6s in the tests).
	o.expect(append(before, after...)...)
}
