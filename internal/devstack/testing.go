package devstack

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// ToolsBin is the repository's .tools/bin (where `make tools` puts temporal
// and daprd), found by walking up from the working directory to go.mod.
func ToolsBin() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, ".tools", "bin"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("devstack: no go.mod above the working directory")
		}
		dir = parent
	}
}

// StartT starts a headless stack for a test in a temporary directory and
// returns it with a gRPC connection to its daprd; both are stopped when the
// test ends. Dir and ToolsBin in o are filled in when empty.
//
// With -short (make unit) it skips the test: unit runs start no server.
func StartT(t testing.TB, o Options) (*Stack, *grpc.ClientConn) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts Redis, Temporal and daprd: runs in make test, not with -short")
	}
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	if o.ToolsBin == "" {
		bin, err := ToolsBin()
		if err != nil {
			t.Fatal(err)
		}
		o.ToolsBin = bin
	}
	o.Headless = true
	o.TemporalInMemory = true // a test's stack is never restarted
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Stop)
	conn, err := grpc.NewClient(st.DaprGRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return st, conn
}
