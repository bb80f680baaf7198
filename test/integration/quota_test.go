package integration

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/devstack"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Issue 46 item 4 on the real stack: a second API on the shared stack with
// QUOTA_WORKERS_PER_TENANT=2 and an operator of a tenant of its own. Three
// concurrent creates race for two slots through daprd's ETags on the real
// Redis: exactly two pass, the third is RESOURCE_EXHAUSTED naming the
// quota; a delete frees a slot. Its /health has the Redis check (item 3),
// Healthy on the harness's redis-server (appendonly yes, noeviction).
func testQuotas(t *testing.T) {
	e := sharedEnv(t)
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	token := "wm_" + hex.EncodeToString(tok)
	sum := sha256.Sum256([]byte(token))
	tokens := filepath.Join(t.TempDir(), "api-tokens")
	if err := os.WriteFile(tokens, []byte("sha256:"+hex.EncodeToString(sum[:])+" operator quotas quota-test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hport, err := devstack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	healthURL := fmt.Sprintf("http://127.0.0.1:%d/health", hport)
	var client pb.WorkManagerServiceClient
	api, _ := e.onFreePort(func(addr string) (*devstack.Proc, error) {
		p, err := e.stack.StartAPI(filepath.Join(e.bins, "api"), addr, "API_TOKENS_FILE="+tokens, "QUOTA_WORKERS_PER_TENANT=2",
			fmt.Sprintf("WORKMANAGER_API_HEALTH_ADDR=127.0.0.1:%d", hport), "API_RATE_LIMIT=1000", "API_RATE_BURST=1000")
		if err != nil {
			return p, err
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(devstack.Bearer(token)))
		if err != nil {
			return p, err
		}
		t.Cleanup(func() { conn.Close() })
		client = pb.NewWorkManagerServiceClient(conn)
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) && !p.Exited() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err = client.ListWorkers(ctx, &pb.ListWorkersRequest{})
			cancel()
			if err == nil {
				return p, nil
			}
			time.Sleep(100 * time.Millisecond)
		}
		return p, fmt.Errorf("the quota API did not answer: %v\n%s", err, p.Tail())
	})
	t.Cleanup(api.Kill)

	var mu sync.Mutex
	var ids []string
	t.Cleanup(func() {
		for _, id := range ids {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			_, _ = client.DeleteWorker(ctx, &pb.DeleteWorkerRequest{WorkerId: id})
			cancel()
		}
	})
	create := func() (string, error) {
		r, err := client.CreateWorker(ctxT(t), &pb.CreateWorkerRequest{MimeType: "text/x-python", Topic: "quotas." + topicName(t, "in"),
			Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: echoWorker("quota-out", "v1")}}})
		if err == nil {
			mu.Lock()
			ids = append(ids, r.GetWorkerId())
			mu.Unlock()
		}
		return r.GetWorkerId(), err
	}
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := create()
			errs <- err
		}()
	}
	var refused []error
	for range 3 {
		if err := <-errs; err != nil {
			refused = append(refused, err)
		}
	}
	if len(refused) != 1 || status.Code(refused[0]) != codes.ResourceExhausted || !strings.Contains(refused[0].Error(), "QUOTA_WORKERS_PER_TENANT") ||
		!strings.Contains(refused[0].Error(), "the limit is 2") {
		t.Fatalf("three concurrent creates for two slots: refused %v (workers %v), want exactly one RESOURCE_EXHAUSTED naming QUOTA_WORKERS_PER_TENANT", refused, ids)
	}
	if _, err := create(); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "tenant quotas has 2 workers") {
		t.Fatalf("a fourth create: %v", err)
	}
	if _, err := client.DeleteWorker(ctxT(t), &pb.DeleteWorkerRequest{WorkerId: ids[0]}); err != nil {
		t.Fatal(err)
	}
	if _, err := create(); err != nil {
		t.Fatalf("after a delete: %v", err)
	}

	// The API's Redis check (it runs in the background at start).
	check := waitHealthCheck(t, healthURL, "redis_config")
	if check.Status != "Healthy" || !strings.Contains(check.Detail, "maxmemory-policy noeviction, appendonly yes") {
		t.Fatalf("api redis_config: %+v", check)
	}
}

type healthCheck struct {
	Status string `json:"status"`
	Detail string `json:"detail"`
}

// waitHealthCheck waits for check name to appear in the /health at url.
func waitHealthCheck(t *testing.T, url, name string) healthCheck {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var last string
		if resp, err := http.Get(url); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			last = string(b)
			var r struct {
				Checks map[string]healthCheck `json:"checks"`
			}
			if json.Unmarshal(b, &r) == nil {
				if c, ok := r.Checks[name]; ok {
					return c
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no check %s after 30 s: %s", url, name, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The node's Redis check on the harness's redis-server (issue 46 item 3):
// Healthy, naming what it found.
func testRedisConfigCheck(t *testing.T) {
	e := sharedEnv(t)
	c := waitHealthCheck(t, e.nodeURL+"/health", "redis_config")
	if c.Status != "Healthy" || !strings.Contains(c.Detail, "maxmemory-policy noeviction, appendonly yes, appendfsync everysec") {
		t.Fatalf("node redis_config: %+v", c)
	}
}
