package main

import (
	"slices"
	"testing"
)

// The node's services stop in the order its shutdown depends on (the
// reverse of the start order services lists).
func TestServicesStopInTheOrderShutdownNeeds(t *testing.T) {
	var stopOrder []string
	for _, s := range services(&parts{}) {
		n, ok := s.(interface{ Name() string })
		if !ok {
			t.Fatalf("service %T has no name", s)
		}
		stopOrder = append([]string{n.Name()}, stopOrder...)
	}
	at := func(name string) int {
		i := slices.Index(stopOrder, name)
		if i < 0 {
			t.Fatalf("no service %q in %v", name, stopOrder)
		}
		return i
	}
	before := func(first, then, why string) {
		t.Helper()
		if at(first) >= at(then) {
			t.Errorf("%s stops after %s: %s (stop order %v)", first, then, why, stopOrder)
		}
	}
	// The loops that end with the signal are done before the drain.
	for _, loop := range []string{"temporal lease", "reconcile", "recovery", "member gate"} {
		before(loop, "hot path", "nothing attaches a worker while the node drains")
	}
	before("hot path", "worker stats", "the hot path is cut off only after it drained")
	before("worker stats", "node shutdown", "the last interval's counts are written before the node shuts down")
	before("infra events", "node shutdown", "infrastructure events stop with the hot path, as before")
	before("node shutdown", "membership", "peers take the node's group locks only once it released them")
	before("membership", "temporal node worker", "the node leaves before its connections close")
	before("temporal worker", "temporal client", "workers stop before their client closes")
	before("node", "dapr connection", "the engines close before daprd's connection")
	if last := stopOrder[len(stopOrder)-1]; last != "crash journal" {
		t.Errorf("%s stops last, want the crash journal (a normal stop is not a crash)", last)
	}
	before("dapr connection", "tracing", "traces are flushed after everything that traces")
}
