package integration

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The package's tests run WM_INTEGRATION_PARALLEL at a time (make test
// sets it; 4 when unset), longest first: the run then ends about when the
// longest test does or when the total work is shared out, whichever is
// later, instead of when a long test that happened to start last ends.
// Go's own -parallel admits parallel tests in no set order (make test sets
// it above the number of tests, so that this scheduler alone decides).

// expectedSeconds are the tests that take longest, with their time in a
// make test run on the 2-core development machine (the list make test
// prints at its end, .run/test/integration-times.txt). A test not listed
// counts as short. Only the order matters, not the figures.
var expectedSeconds = map[string]int{
	"TestManyTopicsSurviveStopStartCycles":                   360,
	"TestSharedStack":                                        235,
	"TestGroupMutualExclusionAcrossNodes":                    207,
	"TestStopWaitsForPausedMemberAndLapsedNodeServesNothing": 200,
	"TestTemporalUIScreenshots":                              117,
	"TestWmctl":                                              113,
	"TestHalfAppliedChangeLeavesOneTruth":                    73,
	"TestInProcessNativeCrashIsQuarantined":                  65,
	"TestDotnetWorkers":                                      71,
	"TestStopOfASlowWorkerIsBounded":                         71,
	"TestTenants":                                            67,
	"TestConcurrentUpdatesAcrossContinueAsNew":               66,
	"TestStreamReconnectsAfterDaprdRestart":                  61,
	"TestHealthTracksBrokerOutage":                           59,
	"TestRecoveryAfterWholeStackRestart":                     56,
	"TestSecondNodeTakesOver":                                52,
}

// inTurn is t.Parallel for this package: t then waits for its turn (a free
// place among WM_INTEGRATION_PARALLEL, longest waiting test first) and
// gives the place back when it ends.
func inTurn(t *testing.T) {
	t.Parallel()
	asked := time.Now()
	<-turns.wait(t.Name()) // go test's -timeout bounds the wait
	began := time.Now()
	t.Cleanup(func() { turns.done(t.Name(), began.Sub(asked), time.Since(began), t.Failed()) })
}

// turns is the package's scheduler. It hands out the first places once no
// new test has asked for 300 ms: by then every test Go admitted has, and
// the longest of them goes first.
var turns = &scheduler{free: parallelFromEnv()}

func parallelFromEnv() int {
	if n, err := strconv.Atoi(os.Getenv("WM_INTEGRATION_PARALLEL")); err == nil && n > 0 {
		return n
	}
	return 4
}

type scheduler struct {
	mu      sync.Mutex
	free    int
	waiting []waiter
	settle  *time.Timer
	settled bool
	ran     []ranFor
	first   time.Time
}

// ranFor is one test's record for the times report.
type ranFor struct {
	name         string
	waited, took time.Duration
	failed       bool
}

type waiter struct {
	name  string
	ready chan struct{}
}

func (s *scheduler) wait(name string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.first.IsZero() {
		s.first = time.Now()
	}
	w := waiter{name: name, ready: make(chan struct{})}
	s.waiting = append(s.waiting, w)
	sort.SliceStable(s.waiting, func(i, j int) bool {
		return expectedSeconds[s.waiting[i].name] > expectedSeconds[s.waiting[j].name]
	})
	if s.settled {
		s.dispatchLocked()
	} else if s.settle == nil {
		s.settle = time.AfterFunc(300*time.Millisecond, s.settleNow)
	} else {
		s.settle.Reset(300 * time.Millisecond)
	}
	return w.ready
}

func (s *scheduler) settleNow() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settled = true
	s.dispatchLocked()
}

func (s *scheduler) done(name string, waited, took time.Duration, failed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ran = append(s.ran, ranFor{name, waited, took, failed})
	s.free++
	s.dispatchLocked()
}

func (s *scheduler) dispatchLocked() {
	for s.free > 0 && len(s.waiting) > 0 {
		s.free--
		close(s.waiting[0].ready)
		s.waiting = s.waiting[1:]
	}
}

// writeTimes writes each test's own time, the slowest first, to the file
// WM_INTEGRATION_TIMES names (make test shows its head); nothing when it
// is unset.
func (s *scheduler) writeTimes() error {
	path := os.Getenv("WM_INTEGRATION_TIMES")
	if path == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ran := slices.Clone(s.ran)
	slices.SortFunc(ran, func(a, b ranFor) int { return cmp.Compare(b.took, a.took) })
	var sum time.Duration
	for _, r := range ran {
		sum += r.took
	}
	var b strings.Builder
	fmt.Fprintf(&b, "==> integration tests by their own time (%d tests, %d at a time; their sum %s, the run %s):\n",
		len(ran), parallelFromEnv(), sum.Round(time.Second), time.Since(s.first).Round(time.Second))
	for _, r := range ran {
		mark := ""
		if r.failed {
			mark = "  FAILED"
		}
		fmt.Fprintf(&b, "    %6.1fs  %-58s (started after %.0fs)%s\n", r.took.Seconds(), r.name, r.waited.Seconds(), mark)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
