package devstack

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.temporal.io/api/operatorservice/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestTemporalOnAnOldDatabaseGetsTheSearchAttributes: a dev server whose
// database was made without our search attributes (an older version's
// `make run`) has them all after startTemporal, which waits for the
// frontend over gRPC (no CLI polls).
func TestTemporalOnAnOldDatabaseGetsTheSearchAttributes(t *testing.T) {
	// go test runs in the package's directory (runtime.Caller's path is
	// the module's, not the checkout's, under -trimpath).
	tools, err := filepath.Abs(filepath.Join("..", "..", ".tools", "bin"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(tools, "temporal")); err != nil {
		t.Fatalf("the temporal CLI is built by `make tools` (make test does it first): %v", err)
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "temporal"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := &Stack{Options: Options{Dir: dir, ToolsBin: tools, Headless: true}}
	defer s.Stop()

	// The old database: made by a server started without the attributes.
	if err := s.withFreePorts(ctx, func(ctx context.Context) error {
		p, err := StartProc(dir, "temporal-old", nil, filepath.Join(tools, "temporal"), "server", "start-dev",
			"--ip", "127.0.0.1", "--port", strconv.Itoa(s.TemporalPort), "--headless", "--log-level", "warn",
			"--db-filename", filepath.Join(dir, "temporal", "temporal.db"))
		if err != nil {
			return err
		}
		s.procs = append(s.procs, p)
		conn, err := grpc.NewClient(s.TemporalAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer conn.Close()
		op := operatorservice.NewOperatorServiceClient(conn)
		return waitFor(ctx, p, time.Minute, func() error {
			_, err := op.ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: "default"})
			return err
		})
	}, &s.TemporalPort); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	s.procs = nil

	if err := s.withFreePorts(ctx, s.startTemporal, &s.TemporalPort); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(s.TemporalAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	list, err := operatorservice.NewOperatorServiceClient(conn).ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: "default"})
	if err != nil {
		t.Fatal(err)
	}
	for _, sa := range SearchAttributes {
		name, _, _ := strings.Cut(sa, "=")
		if _, ok := list.GetCustomAttributes()[name]; !ok {
			t.Errorf("search attribute %s missing after the start: %v", name, list.GetCustomAttributes())
		}
	}
}
