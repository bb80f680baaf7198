package integration

import (
	"context"
	"encoding/json"
	"fmt"
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

// waitBroker waits until the node's broker check has status and its detail
// contains want, and returns the detail.
func (e *env) waitBroker(t *testing.T, limit time.Duration, status health.Status, want string) string {
	t.Helper()
	var detail string
	waitFor(t, limit, fmt.Sprintf("broker %s (%q)", status, want), func() bool {
		c := e.healthReport(t).Checks[health.Broker]
		detail = c.Detail
		return c.Status == status && strings.Contains(c.Detail, want)
	})
	return detail
}

// publishIDs publishes one input per id to topic and returns the ids.
func (e *env) publishIDs(topic string, ids ...string) []string {
	e.t.Helper()
	for _, id := range ids {
		e.publish(topic, id, map[string]any{"n": id}, "")
	}
	return ids
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
	inTurn(t) // a stack of its own
	e := newEnvWith(t, envConfig{nodeEnv: []string{"BROKER_PROBE_INTERVAL=500ms", "BROKER_READY_GRACE=3s"}})
	in, out := topicName(t, "in"), topicName(t, "out")
	e.create(t, in, echoWorker(out, "v1"))
	o := &outputs{t: t, ch: e.subscribe(out), seen: map[string]bool{}}
	e.waitBroker(t, 15*time.Second, health.Healthy, "")

	// Inputs published just before the outage: some are in flight when it
	// starts, and their outputs cannot be published.
	before := e.publishIDs(in, "b1", "b2", "b3", "b4", "b5")
	e.stack.StopRedis()
	t.Logf("broker check while Redis is down: %s", e.waitBroker(t, 15*time.Second, health.Degraded, "publish failing"))
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
	e.waitBroker(t, 30*time.Second, health.Healthy, "")
	waitFor(t, 10*time.Second, "/readyz passing again", func() bool { code, _ := e.readyz(t); return code == http.StatusOK })

	after := e.publishIDs(in, "a1", "a2", "a3")
	// Every input is answered: those caught by the outage come back through
	// redelivery (processingTimeout 6s in the tests).
	o.expect(append(before, after...)...)
}
