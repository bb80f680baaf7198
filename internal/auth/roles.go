package auth

import (
	"context"
	"strings"
)

// MethodRoles is the least role of every RPC of the control API. A method
// missing here is refused to everybody; TestEveryRPCHasARole fails for
// any RPC of the service without an entry.
var MethodRoles = map[string]Role{
	"/workmanager.v1.WorkManagerService/GetWorker":         RoleReader,
	"/workmanager.v1.WorkManagerService/ListWorkers":       RoleReader,
	"/workmanager.v1.WorkManagerService/GetWorkerHistory":  RoleReader,
	"/workmanager.v1.WorkManagerService/ListDeadLetters":   RoleReader,
	"/workmanager.v1.WorkManagerService/CreateWorker":      RoleOperator,
	"/workmanager.v1.WorkManagerService/LoadCode":          RoleOperator,
	"/workmanager.v1.WorkManagerService/RollbackWorker":    RoleOperator,
	"/workmanager.v1.WorkManagerService/StartWorker":       RoleOperator,
	"/workmanager.v1.WorkManagerService/StopWorker":        RoleOperator,
	"/workmanager.v1.WorkManagerService/DeleteWorker":      RoleOperator,
	"/workmanager.v1.WorkManagerService/ReplayDeadLetters": RoleOperator,
	"/workmanager.v1.WorkManagerService/RecoverWorkers":    RoleAdmin,
	// Nodes are the cluster's, not a tenant's: ListNodes also refuses
	// readers of tenants other than the default one (services/api), and
	// only admins drain.
	"/workmanager.v1.WorkManagerService/ListNodes": RoleReader,
	"/workmanager.v1.WorkManagerService/DrainNode": RoleAdmin,

	// Health and reflection: readers, unless API_PUBLIC_HEALTH makes them
	// public (Config.PublicMethods).
	"/grpc.health.v1.Health/Check":                                   RoleReader,
	"/grpc.health.v1.Health/Watch":                                   RoleReader,
	"/grpc.health.v1.Health/List":                                    RoleReader,
	"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":      RoleReader,
	"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": RoleReader,
}

// HealthAndReflection are the methods API_PUBLIC_HEALTH opens.
var HealthAndReflection = []string{
	"/grpc.health.v1.Health/Check",
	"/grpc.health.v1.Health/Watch",
	"/grpc.health.v1.Health/List",
	"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
	"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
}

// ChangingMethods are the RPCs that change something (operator or admin
// role): the per-caller rate limit applies to them.
func ChangingMethods() map[string]bool {
	m := map[string]bool{}
	for method, role := range MethodRoles {
		if role >= RoleOperator {
			m[method] = true
		}
	}
	return m
}

// ReadingMethods are the control API's RPCs that only read (the reader
// role; health and reflection left out): they have a rate limit of their
// own.
func ReadingMethods() map[string]bool {
	m := map[string]bool{}
	for method, role := range MethodRoles {
		if role == RoleReader && strings.HasPrefix(method, "/workmanager.v1.") {
			m[method] = true
		}
	}
	return m
}

// CallerKey names the caller of a call the interceptor let through (its
// tenant, subject and how it authenticated), e.g. for rate limits.
func CallerKey(ctx context.Context) string {
	p, ok := FromContext(ctx)
	if !ok {
		return "unauthenticated"
	}
	return p.Tenant + "/" + p.Subject + " (" + p.Via + ")"
}
