package api

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/auth"
	"github.com/virtufin/workmanager/internal/tenant"
)

// nameSpace namespaces the worker ids derived from worker names.
var nameSpace = uuid.MustParse("0b8f4a59-2f3e-4f57-8d63-7a1d2c9e5b41")

// NameWorkerID is the id of tenant t's worker named name (a name-based
// UUID: every API instance derives the same, so a name needs no index and
// two creates with one name meet on one workflow id). Names are per tenant;
// the default tenant's ids are those from before tenants.
func NameWorkerID(t, name string) string {
	key := "name:" + name
	if t != tenant.Default && t != "" {
		key = "name:" + t + "/" + name
	}
	return tenant.WorkerID(t, uuid.NewSHA1(nameSpace, []byte(key)))
}

// caller is the principal of the call, put into ctx by the auth
// interceptor; a call without one (the API used in process, as in unit
// tests) acts as the default tenant's admin.
func caller(ctx context.Context) auth.Principal {
	if p, ok := auth.FromContext(ctx); ok {
		return p
	}
	return auth.Principal{Subject: "in-process", Role: auth.RoleAdmin, Tenant: tenant.Default, Via: "none"}
}

// mayAccess reports whether p may see and change worker id: a worker of
// its own tenant, or any worker for an admin.
func mayAccess(p auth.Principal, id string) bool {
	return p.Role >= auth.RoleAdmin || tenant.Of(id) == p.Tenant
}

// validName accepts 1..63 of a-z 0-9 -, starting with a letter, not ending
// with "-", and not shaped like a UUID (which would read as an id).
func validName(name string) error {
	if name == "" || len(name) > 63 {
		return status.Errorf(codes.InvalidArgument, "name %q must be 1 to 63 characters long", name)
	}
	for i, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return status.Errorf(codes.InvalidArgument, "name %q has %q at position %d; allowed: a-z 0-9 -", name, c, i)
		}
	}
	if c := name[0]; c < 'a' || c > 'z' {
		return status.Errorf(codes.InvalidArgument, "name %q must start with a letter", name)
	}
	if name[len(name)-1] == '-' {
		return status.Errorf(codes.InvalidArgument, "name %q must not end with \"-\"", name)
	}
	if _, err := uuid.Parse(name); err == nil {
		return status.Errorf(codes.InvalidArgument, "name %q is shaped like a worker id (a UUID); pick another", name)
	}
	return nil
}

// resolve turns the worker_id of a request — a worker id or a name of
// one of the caller's tenant's workers — into the worker id, and says how
// to name the worker in errors (its id, or its name quoted). Anything else names no worker: NOT_FOUND,
// also another tenant's worker (the same answer as for a worker that does
// not exist, so that ids of other tenants cannot be probed).
func resolve(ctx context.Context, ref string) (id, display string, err error) {
	if ref == "" {
		return "", "", status.Error(codes.InvalidArgument, "worker_id is empty (give a worker id or a worker name)")
	}
	p := caller(ctx)
	if _, _, ok := tenant.ParseWorkerID(ref); ok {
		if !mayAccess(p, ref) {
			return "", "", status.Errorf(codes.NotFound, "worker %s not found", ref)
		}
		return ref, ref, nil
	}
	if validName(ref) == nil {
		// Shown by its name only: the derived id is no worker's when the
		// name is unknown, and would read as one.
		return NameWorkerID(p.Tenant, ref), fmt.Sprintf("%q", ref), nil
	}
	return "", "", status.Errorf(codes.NotFound, "worker %s not found (neither a worker id nor a worker name)", ref)
}
