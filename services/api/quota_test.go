package api

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/mocks"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/auth"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/failure"
	"github.com/virtufin/workmanager/internal/state"
	"github.com/virtufin/workmanager/internal/tenant"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/workflows"
)

// fakeTemporal does what a worker's workflow does with the catalog: a
// create saves the worker (after gate, when set, is closed), a delete
// removes it; fail makes the next creates fail with it.
type fakeTemporal struct {
	t    *testing.T
	tc   *mocks.Client
	cat  *catalog.Catalog
	mu   sync.Mutex
	gate chan struct{}
	fail error
	// entered is told of each create that reached Temporal.
	entered chan string
}

func newQuotaServer(t *testing.T, q Quotas) (*Server, *fakeTemporal, *state.MemoryStore) {
	store := state.NewMemoryStore()
	cat := catalog.New(store)
	f := &fakeTemporal{t: t, tc: mocks.NewClient(t), cat: cat, entered: make(chan string, 100)}
	f.tc.On("NewWithStartWorkflowOperation", mock.Anything, mock.Anything, mock.Anything).Return(nil).Maybe()
	f.tc.On("UpdateWithStartWorkflow", mock.Anything, mock.Anything).Return(func(ctx context.Context, o client.UpdateWithStartWorkflowOptions) (client.WorkflowUpdateHandle, error) {
		id := strings.TrimPrefix(o.UpdateOptions.WorkflowID, workflows.WorkflowID(""))
		f.entered <- id
		f.mu.Lock()
		gate, fail := f.gate, f.fail
		f.mu.Unlock()
		if gate != nil {
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if fail != nil {
			return nil, fail
		}
		if err := cat.SaveWorker(ctx, catalog.Worker{ID: id, Tenant: tenant.Of(id), MIMEType: engines.MIMEPython, Topic: "t", Status: catalog.StatusStopped}); err != nil {
			return nil, err
		}
		h := mocks.NewWorkflowUpdateHandle(t)
		h.On("Get", mock.Anything, mock.Anything).Return(nil)
		return h, nil
	}).Maybe()
	f.tc.On("UpdateWorkflow", mock.Anything, mock.MatchedBy(func(o client.UpdateWorkflowOptions) bool { return o.UpdateName == workflows.UpdateDelete })).Return(
		func(ctx context.Context, o client.UpdateWorkflowOptions) (client.WorkflowUpdateHandle, error) {
			if err := cat.DeleteWorker(ctx, strings.TrimPrefix(o.WorkflowID, workflows.WorkflowID(""))); err != nil {
				return nil, err
			}
			h := mocks.NewWorkflowUpdateHandle(t)
			h.On("Get", mock.Anything, mock.Anything).Return(nil)
			return h, nil
		}).Maybe()
	if q.WorkerMemory == nil {
		q.WorkerMemory = DefaultWorkerMemory
	}
	s := New(slog.New(slog.NewTextHandler(io.Discard, nil)), f.tc, cat, engines.BuiltinMIMETypes(),
		Options{OperationTimeout: 10 * time.Second, Quotas: q, QuotaStore: store})
	return s, f, store
}

func tenantCtx(t string) context.Context {
	return auth.WithPrincipal(context.Background(), auth.Principal{Subject: "s", Role: auth.RoleOperator, Tenant: t, Via: "token"})
}

func createIn(ctx context.Context, s *Server, mime string) (string, error) {
	r, err := s.CreateWorker(ctx, &pb.CreateWorkerRequest{MimeType: mime, Topic: "acme.t",
		Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: []byte("def process(e): pass")}}})
	return r.GetWorkerId(), err
}

func wantExhausted(t *testing.T, err error, want ...string) {
	t.Helper()
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("got %v, want RESOURCE_EXHAUSTED", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%v lacks %q", err, w)
		}
	}
}

func reservations(t *testing.T, store state.Store) []reservation {
	t.Helper()
	rs, _, err := state.GetJSON[[]reservation](context.Background(), store, quotaReservationsKey)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// Over the per-tenant count the create is refused, naming the quota, the
// count and the setting; another tenant is not affected; a delete frees
// the slot.
func TestQuotaWorkersPerTenant(t *testing.T) {
	s, _, _ := newQuotaServer(t, Quotas{WorkersPerTenant: 2})
	acme := tenantCtx("acme")
	var ids []string
	for range 2 {
		id, err := createIn(acme, s, engines.MIMEPython)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	_, err := createIn(acme, s, engines.MIMEPython)
	wantExhausted(t, err, "QUOTA_WORKERS_PER_TENANT", "tenant acme has 2 workers", "the limit is 2")
	if _, err := s.CreateWorker(tenantCtx("globex"), &pb.CreateWorkerRequest{MimeType: engines.MIMEPython, Topic: "globex.t",
		Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: []byte("def process(e): pass")}}}); err != nil {
		t.Fatalf("another tenant: %v", err)
	}
	if _, err := s.DeleteWorker(acme, &pb.DeleteWorkerRequest{WorkerId: ids[0]}); err != nil {
		t.Fatal(err)
	}
	if _, err := createIn(acme, s, engines.MIMEPython); err != nil {
		t.Fatalf("after a delete: %v", err)
	}
}

// The cluster-wide count spans tenants.
func TestQuotaWorkersTotal(t *testing.T) {
	s, _, _ := newQuotaServer(t, Quotas{WorkersTotal: 1})
	if _, err := createIn(tenantCtx("acme"), s, engines.MIMEPython); err != nil {
		t.Fatal(err)
	}
	_, err := s.CreateWorker(tenantCtx("globex"), &pb.CreateWorkerRequest{MimeType: engines.MIMEPython, Topic: "globex.t",
		Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: []byte("def process(e): pass")}}})
	wantExhausted(t, err, "QUOTA_WORKERS_TOTAL", "the cluster has 1 workers", "the limit is 1")
}

// The memory quota adds up the engines' estimates.
func TestQuotaMemoryPerTenant(t *testing.T) {
	s, _, _ := newQuotaServer(t, Quotas{MemoryPerTenant: 40 << 20})
	acme := tenantCtx("acme")
	for range 2 { // 2 × 16 MiB
		if _, err := createIn(acme, s, engines.MIMEPython); err != nil {
			t.Fatal(err)
		}
	}
	_, err := createIn(acme, s, engines.MIMEPython)
	wantExhausted(t, err, "QUOTA_MEMORY_PER_TENANT_BYTES", "2 workers take an estimated 32.0 MiB", "16.0 MiB more", "the limit is 40.0 MiB")
	// A native worker's estimate (8 MiB) still fits.
	if _, err := createIn(acme, s, engines.MIMENativeDLL); err != nil {
		t.Fatalf("native: %v", err)
	}
}

// Two creates racing for the last free slot: exactly one passes the
// quota. The first to reserve is held inside its create (as a slow
// workflow would be) until the other has been answered.
func TestQuotaConcurrentCreatesForTheLastSlot(t *testing.T) {
	s, f, store := newQuotaServer(t, Quotas{WorkersPerTenant: 1})
	f.gate = make(chan struct{})
	acme := tenantCtx("acme")
	type result struct {
		id  string
		err error
	}
	results := make(chan result, 2)
	for range 2 {
		go func() {
			id, err := createIn(acme, s, engines.MIMEPython)
			results <- result{id, err}
		}()
	}
	var first result
	select {
	case first = <-results:
	case <-time.After(10 * time.Second):
		t.Fatal("neither create was answered while one is held in its create: both passed the quota")
	}
	wantExhausted(t, first.err, "QUOTA_WORKERS_PER_TENANT", "1 of them being created")
	close(f.gate)
	second := <-results
	if second.err != nil {
		t.Fatalf("the winner: %v", second.err)
	}
	if len(f.entered) != 1 {
		t.Fatalf("%d creates reached Temporal, want 1", len(f.entered))
	}
	if rs := reservations(t, store); len(rs) != 1 || rs[0].ID != second.id {
		t.Fatalf("reservations %+v, want the winner's (until it expires)", rs)
	}
}

// A failed create releases its slot at once.
func TestQuotaFailedCreateFreesItsSlot(t *testing.T) {
	s, f, store := newQuotaServer(t, Quotas{WorkersPerTenant: 1})
	f.fail = failure.New(failure.InvalidArgument, "SyntaxError: invalid syntax (line 1)")
	acme := tenantCtx("acme")
	if _, err := createIn(acme, s, engines.MIMEPython); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("got %v, want the create's INVALID_ARGUMENT", err)
	}
	if rs := reservations(t, store); len(rs) != 0 {
		t.Fatalf("the failed create's reservation stayed: %+v", rs)
	}
	f.fail = nil
	if _, err := createIn(acme, s, engines.MIMEPython); err != nil {
		t.Fatalf("after a failed create: %v", err)
	}
}

// A create that died after reserving (its API crashed) holds the slot
// only until its reservation expires.
func TestQuotaExpiredReservationDoesNotCount(t *testing.T) {
	s, _, store := newQuotaServer(t, Quotas{WorkersPerTenant: 1})
	ctx := context.Background()
	dead := reservation{ID: tenant.WorkerID("acme", [16]byte{1}), Tenant: "acme", Bytes: 16 << 20, Token: "crashed", Expires: time.Now().Add(time.Minute).UnixMilli()}
	if err := state.UpdateJSON(ctx, store, quotaReservationsKey, func(rs *[]reservation) bool { *rs = append(*rs, dead); return true }); err != nil {
		t.Fatal(err)
	}
	_, err := createIn(tenantCtx("acme"), s, engines.MIMEPython)
	wantExhausted(t, err, "1 of them being created")
	if err := state.UpdateJSON(ctx, store, quotaReservationsKey, func(rs *[]reservation) bool {
		(*rs)[0].Expires = time.Now().Add(-time.Second).UnixMilli()
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := createIn(tenantCtx("acme"), s, engines.MIMEPython); err != nil {
		t.Fatalf("after the reservation expired: %v", err)
	}
	for _, r := range reservations(t, store) {
		if r.Token == "crashed" {
			t.Fatalf("the expired reservation was not dropped: %+v", r)
		}
	}
}

// Without quotas nothing is reserved (dev: 0 is unlimited).
func TestNoQuotasNoReservations(t *testing.T) {
	s, _, store := newQuotaServer(t, Quotas{})
	if _, err := createIn(tenantCtx("acme"), s, engines.MIMEPython); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Get(context.Background(), quotaReservationsKey); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("reservations written without quotas: %v", err)
	}
}

func TestParseWorkerMemory(t *testing.T) {
	m, err := ParseWorkerMemory("text/x-python=20971520, application/x-native-dll=1048576")
	if err != nil || m[engines.MIMEPython] != 20<<20 || m[engines.MIMENativeDLL] != 1<<20 || m[engines.MIMECSharp] != DefaultWorkerMemory[engines.MIMECSharp] {
		t.Fatalf("%v %v", m, err)
	}
	if _, err := ParseWorkerMemory("text/x-python"); err == nil || !strings.Contains(err.Error(), "QUOTA_WORKER_MEMORY") {
		t.Fatalf("bad entry: %v", err)
	}
}
