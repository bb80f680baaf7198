package integration

import (
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/virtufin/workmanager/internal/devstack"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Issue 30 item 5 on the real stack, with two tenants' tokens: a group is
// its tenant's. acme and globex each run a worker in a group of the same
// name; inside each tenant no two executions overlap, across the two they
// run side by side (before, globex could serialize and starve acme's
// group), and each tenant's fencing tokens are a sequence of its own.
func TestGroupsOfTwoTenantsAreTheirOwn(t *testing.T) {
	inTurn(t) // functional: runs next to the other parallel tests after the serial ones
	e := newEnvWithTokens(t, []apiToken{
		{"acme-operator-token-02", "operator", "acme", "alice"},
		{"globex-operator-token2", "operator", "globex", "bob"},
	})
	ctx := ctxT(t)
	dir := workerDir(t)
	group := "shared-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	const n = 8
	logs, inputs := map[string]string{}, map[string]string{}
	for _, tc := range []struct{ tenant, token string }{{"acme", "acme-operator-token-02"}, {"globex", "globex-operator-token2"}} {
		conn, err := grpc.NewClient(e.apiAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithPerRPCCredentials(devstack.Bearer(tc.token)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		in, out := tc.tenant+"."+topicName(t, "in"), tc.tenant+"."+topicName(t, "out")
		logs[tc.tenant] = filepath.Join(dir, tc.tenant+".log")
		if _, err := pb.NewWorkManagerServiceClient(conn).CreateWorker(ctx, &pb.CreateWorkerRequest{MimeType: "text/x-python",
			Topic: in, Group: group, Code: pyCode(loggingWorker(tc.tenant, logs[tc.tenant], out, false))}); err != nil {
			t.Fatalf("%s creates its worker in group %s: %v", tc.tenant, group, err)
		}
		inputs[tc.tenant] = in
	}
	// Both workers exist before the first input: interleaved publishes.
	for i := range n {
		for tenant, in := range inputs {
			e.publish(in, fmt.Sprintf("%s-%d", tenant, i), map[string]any{"sleep_ms": 400}, "")
		}
	}
	waitFor(t, 3*time.Minute, fmt.Sprintf("%d executions per tenant", n), func() bool {
		return len(calls(t, logs["acme"])) >= n && len(calls(t, logs["globex"])) >= n
	})
	acme, globex := calls(t, logs["acme"]), calls(t, logs["globex"])
	for name, cs := range map[string][]call{"acme": acme, "globex": globex} {
		if o := overlaps(append([]call(nil), cs...)); o != 0 {
			t.Errorf("%s: %d overlapping executions inside its group", name, o)
		}
		seen := map[string]bool{}
		for _, c := range cs {
			if c.Tok == "" || seen[c.Tok] {
				t.Errorf("%s: fencing token %q missing or reused", name, c.Tok)
			}
			seen[c.Tok] = true
		}
		if !seen["1"] {
			t.Errorf("%s: tokens %v do not start a sequence of its own at 1", name, seen)
		}
	}
	if o := overlaps(append(append([]call(nil), acme...), globex...)); o == 0 {
		t.Errorf("acme's and globex's groups %q never ran side by side: they share one lock", group)
	}
}
