package main

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/auth"
)

// TestReadingCallsAreRateLimited: issue 32 item 6. A caller's reading
// calls (ListWorkers, ListDeadLetters, …) have a bucket of their own
// (API_READ_RATE_*), apart from its changing calls' (API_RATE_*).
func TestReadingCallsAreRateLimited(t *testing.T) {
	changing, reading := rateLimits(config{RateLimit: 1, RateBurst: 1, ReadRateLimit: 0.001, ReadRateBurst: 2})
	ctx := auth.WithPrincipal(context.Background(), auth.Principal{Subject: "s", Role: auth.RoleReader, Tenant: "acme", Via: "token"})
	call := func(method string) error {
		h := func(context.Context, any) (any, error) { return nil, nil }
		_, err := changing.UnaryInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method}, func(ctx context.Context, req any) (any, error) {
			return reading.UnaryInterceptor()(ctx, req, &grpc.UnaryServerInfo{FullMethod: method}, h)
		})
		return err
	}
	const list, dead, start = "/workmanager.v1.WorkManagerService/ListWorkers", "/workmanager.v1.WorkManagerService/ListDeadLetters", "/workmanager.v1.WorkManagerService/StartWorker"
	if err := call(list); err != nil {
		t.Fatal(err)
	}
	if err := call(dead); err != nil {
		t.Fatal(err)
	}
	err := call(list)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "API_READ_RATE_LIMIT") {
		t.Fatalf("the third read: %v", err)
	}
	if err := call(start); err != nil {
		t.Fatalf("a changing call after the reads: %v", err)
	}
	if err := call("/grpc.health.v1.Health/Check"); err != nil {
		t.Fatalf("health is not limited: %v", err)
	}
}
