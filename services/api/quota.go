package api

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/state"
	"github.com/virtufin/workmanager/internal/tenant"
)

// Quotas bound the workers CreateWorker admits, per tenant and for the
// whole cluster, by count and by their estimated memory on every node
// (every node runs every running worker: docs/scaling.md, "Sizing and
// quotas"). 0 is unlimited.
type Quotas struct {
	WorkersPerTenant int   // QUOTA_WORKERS_PER_TENANT
	WorkersTotal     int   // QUOTA_WORKERS_TOTAL
	MemoryPerTenant  int64 // QUOTA_MEMORY_PER_TENANT_BYTES
	MemoryTotal      int64 // QUOTA_MEMORY_TOTAL_BYTES
	// WorkerMemory is the memory a worker of each MIME type is estimated
	// to take on a node (QUOTA_WORKER_MEMORY overrides
	// DefaultWorkerMemory's entries); a MIME type without one counts
	// DefaultWorkerMemory's largest.
	WorkerMemory map[string]int64
}

// DefaultWorkerMemory are the per-worker memory estimates on one node,
// from the measured figures in docs/scaling.md and docs/performance.md
// with a margin: an idle Python worker 12.7 MiB PSS in its subprocess plus
// 0.3 MiB in the node (16 MiB); a .NET worker one Mono host of 26 MiB
// resident per DOTNET_PROCESSES (32 MiB); a native worker a sandboxed
// host process under NATIVE_ISOLATION=always (8 MiB; 0.13 MiB in
// process).
var DefaultWorkerMemory = map[string]int64{
	engines.MIMEPython:    16 << 20,
	engines.MIMECSharp:    32 << 20,
	engines.MIMEDotnetDLL: 32 << 20,
	engines.MIMENativeDLL: 8 << 20,
}

// ParseWorkerMemory reads QUOTA_WORKER_MEMORY: "mime=bytes,..." entries
// over DefaultWorkerMemory.
func ParseWorkerMemory(s string) (map[string]int64, error) {
	out := map[string]int64{}
	for k, v := range DefaultWorkerMemory {
		out[k] = v
	}
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		mime, n, ok := strings.Cut(item, "=")
		b, err := strconv.ParseInt(strings.TrimSpace(n), 10, 64)
		if !ok || err != nil || b < 0 || strings.TrimSpace(mime) == "" {
			return nil, fmt.Errorf("QUOTA_WORKER_MEMORY: %q is not mime_type=bytes", item)
		}
		out[strings.TrimSpace(mime)] = b
	}
	return out, nil
}

// Validate reports a negative quota.
func (q Quotas) Validate() error {
	if q.WorkersPerTenant < 0 || q.WorkersTotal < 0 || q.MemoryPerTenant < 0 || q.MemoryTotal < 0 {
		return fmt.Errorf("QUOTA_WORKERS_PER_TENANT, QUOTA_WORKERS_TOTAL, QUOTA_MEMORY_PER_TENANT_BYTES and QUOTA_MEMORY_TOTAL_BYTES must be 0 (unlimited) or positive, got %d, %d, %d, %d",
			q.WorkersPerTenant, q.WorkersTotal, q.MemoryPerTenant, q.MemoryTotal)
	}
	return nil
}

func (q Quotas) on() bool {
	return q.WorkersPerTenant > 0 || q.WorkersTotal > 0 || q.MemoryPerTenant > 0 || q.MemoryTotal > 0
}

func (q Quotas) memory(mime string) int64 {
	if b, ok := q.WorkerMemory[mime]; ok {
		return b
	}
	if b, ok := DefaultWorkerMemory[mime]; ok {
		return b
	}
	return slices.Max(mapValues(DefaultWorkerMemory))
}

func mapValues(m map[string]int64) []int64 {
	out := make([]int64, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// The quota's reservations: one key holding the creates in flight, each
// with the worker id it creates, written with ETags (state.UpdateJSON), so
// that two creates racing for the last free slot are serialized and one
// of them is refused. The workers that exist are counted from the catalog's
// indexes (the truth); a reservation only covers a create until its worker
// is in them. A reservation is dropped when its create fails, when its
// worker is deleted, and in any case once it expires (reservationTTL
// after it was made, well after its create's call ended): a create that
// died after reserving does not hold a slot for longer.
const quotaReservationsKey = state.KeyPrefix + "quota/reservations"

type reservation struct {
	ID      string `json:"id"`
	Tenant  string `json:"tenant"`
	Bytes   int64  `json:"bytes"`
	Token   string `json:"token"`
	Expires int64  `json:"expires_ms"`
}

// quotaState is the API's cache of each worker's MIME type (a worker's
// MIME type never changes), so that the memory quotas read the record of
// each worker once per API process.
type quotaState struct {
	mu    sync.Mutex
	mimes map[string]string
}

func (s *Server) reservationTTL() time.Duration { return s.timeout + time.Minute }

// reserveQuota admits worker w against the quotas, reserving its slot
// until its create has put it in the catalog; release drops the
// reservation (on a failed create). A worker that exists or is reserved
// already (a retry of the same request or name) needs no new slot.
func (s *Server) reserveQuota(ctx context.Context, w catalog.Worker) (release func(), err error) {
	q := s.opts.Quotas
	noop := func() {}
	if !q.on() || s.opts.QuotaStore == nil {
		return noop, nil
	}
	t := tenant.Of(w.ID)
	var tenantIDs, allIDs []string
	if q.WorkersPerTenant > 0 || q.MemoryPerTenant > 0 {
		if tenantIDs, err = s.catalog.TenantWorkerIDs(ctx, t); err != nil {
			return nil, status.Errorf(codes.Unavailable, "checking the quotas: reading tenant %s's workers: %v", t, err)
		}
	}
	if q.WorkersTotal > 0 || q.MemoryTotal > 0 {
		if allIDs, err = s.catalog.WorkerIDs(ctx); err != nil {
			return nil, status.Errorf(codes.Unavailable, "checking the quotas: reading the workers: %v", err)
		}
		slices.Sort(allIDs)
		allIDs = slices.Compact(allIDs)
	}
	var tenantBytes, allBytes int64
	if q.MemoryPerTenant > 0 {
		if tenantBytes, err = s.workersMemory(ctx, tenantIDs, false); err != nil {
			return nil, err
		}
	}
	if q.MemoryTotal > 0 {
		if allBytes, err = s.workersMemory(ctx, allIDs, true); err != nil {
			return nil, err
		}
	}
	mine := reservation{ID: w.ID, Tenant: t, Bytes: q.memory(w.MIMEType), Token: uuid.NewString()}
	var refusal error
	added := false
	err = state.UpdateJSON(ctx, s.opts.QuotaStore, quotaReservationsKey, func(rs *[]reservation) bool {
		refusal, added = nil, false
		now := time.Now().UnixMilli()
		changed := false
		*rs = slices.DeleteFunc(*rs, func(r reservation) bool {
			if r.Expires <= now {
				changed = true
				return true
			}
			return false
		})
		if slices.Contains(tenantIDs, w.ID) || slices.Contains(allIDs, w.ID) ||
			slices.ContainsFunc(*rs, func(r reservation) bool { return r.ID == w.ID }) {
			return changed // exists or being created: no new slot
		}
		// Reservations of workers not yet in the indexes read above.
		var tCount, aCount int
		var tBytes, aBytes int64
		for _, r := range *rs {
			if r.Tenant == t && !slices.Contains(tenantIDs, r.ID) {
				tCount++
				tBytes += r.Bytes
			}
			if !slices.Contains(allIDs, r.ID) {
				aCount++
				aBytes += r.Bytes
			}
		}
		switch {
		case q.WorkersPerTenant > 0 && len(tenantIDs)+tCount+1 > q.WorkersPerTenant:
			refusal = status.Errorf(codes.ResourceExhausted, "quota QUOTA_WORKERS_PER_TENANT exceeded: tenant %s has %d workers (%d of them being created), the limit is %d; delete one, or ask the operator to raise QUOTA_WORKERS_PER_TENANT",
				t, len(tenantIDs)+tCount, tCount, q.WorkersPerTenant)
		case q.WorkersTotal > 0 && len(allIDs)+aCount+1 > q.WorkersTotal:
			refusal = status.Errorf(codes.ResourceExhausted, "quota QUOTA_WORKERS_TOTAL exceeded: the cluster has %d workers (%d of them being created), the limit is %d; delete one, or ask the operator to raise QUOTA_WORKERS_TOTAL (and the nodes' memory)",
				len(allIDs)+aCount, aCount, q.WorkersTotal)
		case q.MemoryPerTenant > 0 && tenantBytes+tBytes+mine.Bytes > q.MemoryPerTenant:
			refusal = status.Errorf(codes.ResourceExhausted, "quota QUOTA_MEMORY_PER_TENANT_BYTES exceeded: tenant %s's %d workers take an estimated %s on every node, this %s worker %s more, the limit is %s; delete a worker, or ask the operator to raise QUOTA_MEMORY_PER_TENANT_BYTES",
				t, len(tenantIDs)+tCount, mib(tenantBytes+tBytes), w.MIMEType, mib(mine.Bytes), mib(q.MemoryPerTenant))
		case q.MemoryTotal > 0 && allBytes+aBytes+mine.Bytes > q.MemoryTotal:
			refusal = status.Errorf(codes.ResourceExhausted, "quota QUOTA_MEMORY_TOTAL_BYTES exceeded: the cluster's %d workers take an estimated %s on every node, this %s worker %s more, the limit is %s; delete a worker, or ask the operator to raise QUOTA_MEMORY_TOTAL_BYTES (and the nodes' memory limit)",
				len(allIDs)+aCount, mib(allBytes+aBytes), w.MIMEType, mib(mine.Bytes), mib(q.MemoryTotal))
		}
		if refusal != nil {
			return changed
		}
		mine.Expires = now + s.reservationTTL().Milliseconds()
		*rs = append(*rs, mine)
		added = true
		return true
	})
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "checking the quotas: %v", err)
	}
	if refusal != nil {
		return nil, refusal
	}
	if !added {
		return noop, nil
	}
	return func() { s.dropReservations(ctx, func(r reservation) bool { return r.Token == mine.Token }) }, nil
}

// releaseQuota drops worker id's reservation, if any (after its delete:
// the catalog no longer counts it, the reservation must not either).
func (s *Server) releaseQuota(ctx context.Context, id string) {
	if !s.opts.Quotas.on() || s.opts.QuotaStore == nil {
		return
	}
	s.dropReservations(ctx, func(r reservation) bool { return r.ID == id })
}

func (s *Server) dropReservations(ctx context.Context, drop func(reservation) bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err := state.UpdateJSON(ctx, s.opts.QuotaStore, quotaReservationsKey, func(rs *[]reservation) bool {
		n := len(*rs)
		*rs = slices.DeleteFunc(*rs, drop)
		return len(*rs) != n
	})
	if err != nil {
		// It expires on its own (reservationTTL).
		s.log.Warn("quota reservation not released; it expires on its own", "err", err, "expires_after", s.reservationTTL())
	}
}

// workersMemory is the estimated memory of the workers ids on a node,
// from their MIME types (cached; records read once). all: ids are every
// worker, so the cache is pruned to them.
func (s *Server) workersMemory(ctx context.Context, ids []string, all bool) (int64, error) {
	s.quota.mu.Lock()
	if s.quota.mimes == nil {
		s.quota.mimes = map[string]string{}
	}
	var missing []string
	for _, id := range ids {
		if _, ok := s.quota.mimes[id]; !ok {
			missing = append(missing, id)
		}
	}
	s.quota.mu.Unlock()
	found := map[string]string{}
	for _, id := range missing {
		w, err := s.catalog.GetWorker(ctx, id)
		if errors.Is(err, catalog.ErrNotFound) {
			continue // a delete in progress
		}
		if err != nil {
			return 0, status.Errorf(codes.Unavailable, "checking the memory quotas: reading worker %s: %v", id, err)
		}
		found[id] = w.MIMEType
	}
	s.quota.mu.Lock()
	defer s.quota.mu.Unlock()
	for id, m := range found {
		s.quota.mimes[id] = m
	}
	if all {
		keep := make(map[string]string, len(ids))
		for _, id := range ids {
			if m, ok := s.quota.mimes[id]; ok {
				keep[id] = m
			}
		}
		s.quota.mimes = keep
	}
	var total int64
	for _, id := range ids {
		if m, ok := s.quota.mimes[id]; ok {
			total += s.opts.Quotas.memory(m)
		}
	}
	return total, nil
}

func mib(b int64) string {
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}
