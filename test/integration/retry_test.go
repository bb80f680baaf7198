package integration

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/dispatch"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Change 14 of our Redis streams component (deploy/dapr/daprd/redisstreams),
// on the real stack: a message the node answers RETRY for comes back after
// the pub/sub's retryDelay (1 s), doubling, not after the broker's
// processing timeout — a minute here, so that each wait below, were it a
// timeout, would take longer than the test allows.
//
//   - A poisoned message's three attempts (backoff 200 ms) end in
//     <topic>-dead well within one timeout; before, two timeouts.
//   - A burst beyond a serial worker's queue (a group: one call at a
//     time, WORKER_QUEUE_DEPTH 2, 60 events of 100 ms) is given back and
//     fed to the worker as its queue drains: every event answered within
//     one timeout, each exactly once. Before, whatever did not fit waited
//     a whole timeout, in waves.
func TestRetriesComeBackBeforeTheProcessingTimeout(t *testing.T) {
	inTurn(t) // a stack of its own
	const timeout = time.Minute
	e := newEnvWith(t, envConfig{nodeEnv: []string{"WORKER_QUEUE_DEPTH=2"}, processingTimeout: timeout})
	dir := workerDir(t)
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := collectFrom(e.subscribe(out))
	dead := collectFrom(e.subscribe(in + dispatch.DeadLetterSuffix))

	poisonLog := filepath.Join(dir, "poison.log")
	e.createWith(t, &pb.CreateWorkerRequest{Code: pyCode(loggingWorker("p", poisonLog, out, true)), Topic: in,
		RetryPolicy: &pb.RetryPolicy{MaxAttempts: 3, BackoffMs: 200}})
	began := time.Now()
	e.publish(in, "poisoned", map[string]any{"poison": true}, "")
	waitFor(t, timeout*3/4, "the poisoned message in "+in+dispatch.DeadLetterSuffix, func() bool { return dead.distinct() == 1 })
	t.Logf("three attempts and the dead letter in %s (processing timeout %s)", time.Since(began).Round(time.Millisecond), timeout)
	if got := calls(t, poisonLog); len(got) != 3 {
		t.Fatalf("the poisoned message ran %d times, want 3: %+v", len(got), got)
	} else {
		for i := 1; i < len(got); i++ {
			// The worker's backoff (200 ms, doubling) is a minimum.
			if gap, least := time.Duration(got[i].Enter-got[i-1].Exit), 200*time.Millisecond<<(i-1); gap < least {
				t.Errorf("attempt %d began %s after attempt %d ended, before the backoff of %s", i+1, gap, i, least)
			}
		}
	}

	slowIn := topicName(t, "slow")
	slowLog := filepath.Join(dir, "slow.log")
	e.createWith(t, &pb.CreateWorkerRequest{Code: pyCode(loggingWorker("s", slowLog, out, false)), Topic: slowIn,
		Group: "serial-" + fmt.Sprint(time.Now().UnixNano())})
	const n = 60
	began = time.Now()
	for i := range n {
		e.publish(slowIn, fmt.Sprintf("s%02d", i), map[string]any{"sleep_ms": 100}, "")
	}
	waitFor(t, timeout*3/4, fmt.Sprintf("%d answers of the serial worker", n), func() bool { return outs.distinct() >= n })
	t.Logf("%d events through a queue of 2 in %s", n, time.Since(began).Round(time.Millisecond))
	seen := map[string]int{}
	for _, c := range calls(t, slowLog) {
		seen[c.ID]++
	}
	for i := range n {
		if id := fmt.Sprintf("s%02d", i); seen[id] != 1 {
			t.Errorf("%s ran %d times, want once", id, seen[id])
		}
	}
	if g := sampleValue(scrapeURL(t, e.nodeURL), "workmanager_worker_queue_rejections_total", nil); g < 1 {
		t.Errorf("no message was given back for a full queue (%v): the test did not test the give-back", g)
	}
}
