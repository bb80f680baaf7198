package validate

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// designRate is the per-topic rate the manifests are sized for (msg/s):
// docs/scaling.md, "Stream length".
const designRate = 1000

// unackedWindow is the longest a message stays unacknowledged on a
// running node: WORKER_MAX_ATTEMPTS deliveries, each handed out again
// after processingTimeout (scanned every redeliverInterval), or a message
// for a worker no node here can run, answered RETRY for
// NOT_RUNNABLE_GRACE and then handed out once more.
func unackedWindow(processing, redeliver time.Duration, attempts int, notRunnable time.Duration) time.Duration {
	return max(time.Duration(attempts)*(processing+redeliver), notRunnable+processing+redeliver)
}

// streamCapProblems: the Redis pub/sub caps every stream (maxLenApprox),
// at least designRate times the unacknowledged window, since Redis trims
// the oldest entries whether or not they were acknowledged; and the
// nodes' and the API's STREAM_MAX_LEN (the per-request cap of what they
// publish) is the same number.
func streamCapProblems(maxLenApprox string, window time.Duration, streamMaxLen string) []string {
	var out []string
	floor := int(float64(designRate) * window.Seconds())
	n, err := strconv.Atoi(maxLenApprox)
	switch {
	case maxLenApprox == "":
		out = append(out, fmt.Sprintf("no metadata maxLenApprox: every stream grows without bound in the Redis that holds the state store; set it to at least %d (%d msg/s x %s unacknowledged, docs/scaling.md, \"Stream length\")", floor, designRate, window))
	case err != nil || n <= 0:
		out = append(out, fmt.Sprintf("maxLenApprox %q is not a positive number of entries", maxLenApprox))
	case n < floor:
		out = append(out, fmt.Sprintf("maxLenApprox %d is below %d (%d msg/s x %s, the longest a message stays unacknowledged): Redis would trim unacknowledged entries (docs/scaling.md, \"Stream length\")", n, floor, designRate, window))
	}
	if streamMaxLen != maxLenApprox {
		out = append(out, fmt.Sprintf("STREAM_MAX_LEN %q differs from the component's maxLenApprox %q: set both to the same number", streamMaxLen, maxLenApprox))
	}
	return out
}

// streamCap applies streamCapProblems to a build's Redis pub/sub.
func (c *checker) streamCap(ps *DaprComponent, processing time.Duration, nodeEnv map[string]corev1.EnvVar) {
	c.t.Helper()
	var capValue, redeliver string
	if m, ok := ps.Meta("maxLenApprox"); ok && m.Value != nil {
		capValue = *m.Value
	}
	if m, ok := ps.Meta("redeliverInterval"); ok && m.Value != nil {
		redeliver = *m.Value
	}
	rd, err := time.ParseDuration(redeliver)
	if err != nil {
		c.errorf("Component %s: redeliverInterval: %v", ps.Metadata.Name, err)
	}
	window := unackedWindow(processing, rd, c.integer(nodeEnv, "WORKER_MAX_ATTEMPTS"), c.duration(nodeEnv, "NOT_RUNNABLE_GRACE"))
	streamMaxLen, _ := c.value(nodeEnv, "STREAM_MAX_LEN")
	for _, p := range streamCapProblems(capValue, window, streamMaxLen) {
		c.errorf("Component %s: %s", ps.Metadata.Name, p)
	}
}

// Issue 46 item 2: the rule refuses an uncapped, a too small and a
// mismatched cap.
func TestStreamCapRule(t *testing.T) {
	window := unackedWindow(120*time.Second, 2*time.Second, 3, 10*time.Minute) // base/node.yaml and pubsub/redis
	if window != 722*time.Second {
		t.Fatalf("window %s", window)
	}
	for name, tc := range map[string]struct{ cap, streamMaxLen, want string }{
		"uncapped (the manifests before)": {"", "", "no metadata maxLenApprox"},
		"not a number":                    {"lots", "lots", `maxLenApprox "lots" is not a positive number`},
		"too small":                       {"100000", "100000", "maxLenApprox 100000 is below 722000"},
		"differs from STREAM_MAX_LEN":     {"1000000", "2000000", `STREAM_MAX_LEN "2000000" differs`},
		"fine":                            {"1000000", "1000000", ""},
	} {
		t.Run(name, func(t *testing.T) {
			got := strings.Join(streamCapProblems(tc.cap, window, tc.streamMaxLen), "; ")
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}
