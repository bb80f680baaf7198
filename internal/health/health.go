// Package health owns a node's health reporting: liveness (/healthz),
// readiness (/readyz: ready once start-up recovery finished and while no
// check with a readiness grace, such as the broker's, has been failing for
// longer than its grace) and a JSON report (/health: Healthy, Degraded while
// recovery runs, while cluster heartbeats fail or while the broker refuses
// publishes or subscriptions, Unhealthy when recovery failed) with one entry
// per check. The broker check is fed by BrokerWatch.
package health

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"
)

// Status of one check or of the whole node.
type Status string

const (
	Healthy   Status = "Healthy"
	Degraded  Status = "Degraded"
	Unhealthy Status = "Unhealthy"
)

// Check is the state of one named check.
type Check struct {
	Status Status `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Since is when the check last changed status.
	Since time.Time `json:"since"`
}

// Report is the JSON body of /health.
type Report struct {
	Status Status           `json:"status"`
	Checks map[string]Check `json:"checks"`
}

// Recovery is the name of the start-up recovery check; the node is ready only
// when it is Healthy.
const Recovery = "recovery"

// Cluster is the name of the cluster membership check: Degraded while this
// node's heartbeats fail (lifecycle changes then reach it only through its
// periodic reconcile). It does not affect readiness.
const Cluster = "cluster"

// State holds the checks. It is safe for concurrent use.
type State struct {
	mu     sync.Mutex
	checks map[string]Check
	graces map[string]time.Duration
	now    func() time.Time
	// recovery: readiness waits for the Recovery check (a node's State).
	recovery bool
}

// New returns a node's State: its recovery check is Degraded ("pending").
func New() *State {
	s := NewEmpty()
	s.recovery = true
	s.Set(Recovery, Degraded, "pending")
	return s
}

// NewEmpty returns a State without checks (the API's): ready unless a
// gated check fails.
func NewEmpty() *State {
	return &State{checks: map[string]Check{}, graces: map[string]time.Duration{}, now: time.Now}
}

// Set records a check.
func (s *State) Set(name string, status Status, detail string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := Check{Status: status, Detail: detail, Since: s.now()}
	if old, ok := s.checks[name]; ok && old.Status == status {
		c.Since = old.Since
	}
	s.checks[name] = c
}

// GateReadiness makes the check name fail readiness once it has not been
// Healthy for longer than grace (the broker check: a short outage keeps the
// node in rotation, a long one takes it out).
func (s *State) GateReadiness(name string, grace time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.graces[name] = grace
}

// Report returns the overall status: the worst of all checks.
func (s *State) Report() Report {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := Report{Status: Healthy, Checks: make(map[string]Check, len(s.checks))}
	names := make([]string, 0, len(s.checks))
	for n := range s.checks {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		c := s.checks[n]
		r.Checks[n] = c
		if rank(c.Status) > rank(r.Status) {
			r.Status = c.Status
		}
	}
	return r
}

// Ready reports whether the node may receive traffic.
func (s *State) Ready() bool {
	ok, _ := s.Readiness()
	return ok
}

// Readiness reports whether the node may receive traffic, and why (or why
// not): recovery must be Healthy, and no gated check may have been failing
// for longer than its grace.
func (s *State) Readiness() (bool, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.checks[Recovery]
	if s.recovery && rec.Status != Healthy {
		return false, fmt.Sprintf("%s: %s: %s", rec.Status, Recovery, rec.Detail)
	}
	now := s.now()
	names := make([]string, 0, len(s.graces))
	for n := range s.graces {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		c, ok := s.checks[n]
		if ok && c.Status != Healthy && now.Sub(c.Since) > s.graces[n] {
			return false, fmt.Sprintf("%s: %s: %s (for %s, grace %s)", c.Status, n, c.Detail,
				now.Sub(c.Since).Round(time.Second), s.graces[n])
		}
	}
	if !s.recovery {
		return true, "ready"
	}
	return true, fmt.Sprintf("%s: %s: %s", rec.Status, Recovery, rec.Detail)
}

func rank(s Status) int {
	switch s {
	case Healthy:
		return 0
	case Degraded:
		return 1
	default:
		return 2
	}
}

// Handler serves /healthz, /readyz and /health.
func (s *State) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, why := s.Readiness()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = w.Write([]byte(why + "\n"))
	})
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		r := s.Report()
		w.Header().Set("Content-Type", "application/json")
		if r.Status == Unhealthy {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(r)
	})
	return mux
}
