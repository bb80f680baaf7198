// Package health owns a node's health reporting: liveness (/healthz),
// readiness (/readyz: ready only once start-up recovery finished) and a JSON
// report (/health: Healthy, Degraded while recovery runs or while cluster
// heartbeats fail, Unhealthy when recovery failed) with one entry per check.
package health

import (
	"encoding/json"
	"net/http"
	"sort"
	"sync"
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
}

// New returns a State whose recovery check is Degraded ("pending").
func New() *State {
	return &State{checks: map[string]Check{Recovery: {Status: Degraded, Detail: "pending"}}}
}

// Set records a check.
func (s *State) Set(name string, status Status, detail string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks[name] = Check{Status: status, Detail: detail}
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
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checks[Recovery].Status == Healthy
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
		r := s.Report()
		rec := r.Checks[Recovery]
		if rec.Status != Healthy {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = w.Write([]byte(string(rec.Status) + ": " + rec.Detail + "\n"))
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
