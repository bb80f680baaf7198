package api

import (
	"fmt"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// nameSpace namespaces the worker ids derived from worker names.
var nameSpace = uuid.MustParse("0b8f4a59-2f3e-4f57-8d63-7a1d2c9e5b41")

// NameWorkerID is the id of the worker named name (a name-based UUID: every
// API instance derives the same, so a name needs no index and two creates
// with one name meet on one workflow id).
func NameWorkerID(name string) string {
	return uuid.NewSHA1(nameSpace, []byte("name:"+name)).String()
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

// resolve turns the worker_id of a request — a worker id (UUID) or a worker
// name — into the worker id, and says how to name the worker in errors.
// Anything else names no worker: NOT_FOUND.
func resolve(ref string) (id, display string, err error) {
	if ref == "" {
		return "", "", status.Error(codes.InvalidArgument, "worker_id is empty (give a worker id or a worker name)")
	}
	if _, err := uuid.Parse(ref); err == nil {
		return ref, ref, nil
	}
	if validName(ref) == nil {
		return NameWorkerID(ref), fmt.Sprintf("%s (%q)", NameWorkerID(ref), ref), nil
	}
	return "", "", status.Errorf(codes.NotFound, "worker %s not found (neither a worker id nor a worker name)", ref)
}
