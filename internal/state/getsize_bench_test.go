package state_test

import (
	"context"
	"fmt"
	"math/rand"
	"slices"
	"testing"
	"time"

	dapr "github.com/dapr/go-sdk/client"

	"github.com/virtufin/workmanager/internal/devstack"
)

// BenchmarkDaprStateGetBySize reads and writes values of growing size
// (binary, as code packages are) through the real daprd and Redis, with
// our state.redis (deploy/dapr/daprd/redisstate) and, in the same run,
// upstream's (DAPRD_UPSTREAM_REDIS_STATE=1): p50 of a Get and of a Set one
// after another, and daprd's CPU per Get. Upstream's Get turns the value
// into a string through a round trip of %q, about 45 ns of daprd's CPU
// per byte.
func BenchmarkDaprStateGetBySize(b *testing.B) {
	type stack struct {
		name string
		st   *devstack.Stack
		c    dapr.Client
	}
	var stacks []stack
	for _, s := range []struct{ name, env string }{{"ours", "0"}, {"upstream", "1"}} {
		st, conn := devstack.StartT(b, devstack.Options{DaprdEnv: []string{"DAPRD_UPSTREAM_REDIS_STATE=" + s.env}})
		stacks = append(stacks, stack{s.name, st, dapr.NewClientWithConnection(conn)})
	}
	ctx := context.Background()
	rnd := rand.New(rand.NewSource(1))
	p50 := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	for range b.N {
		for _, size := range []int{400, 8 << 10, 64 << 10, 1 << 20} {
			value := make([]byte, size)
			rnd.Read(value)
			n := max(10, min(200, (64<<20)/size))
			var gets [2]time.Duration
			for i, s := range stacks {
				var put, get []time.Duration
				cpu := devstack.ProcessCPU(s.st.DaprdPID())
				var getCPU time.Duration
				for j := range n {
					key := fmt.Sprintf("workmanager/bench/size/%d/%d/%d", time.Now().UnixNano(), size, j)
					t0 := time.Now()
					if err := s.c.SaveState(ctx, devstack.StateName, key, value, nil); err != nil {
						b.Fatal(err)
					}
					put = append(put, time.Since(t0))
					cpu = devstack.ProcessCPU(s.st.DaprdPID())
					t0 = time.Now()
					if _, err := s.c.GetState(ctx, devstack.StateName, key, nil); err != nil {
						b.Fatal(err)
					}
					get = append(get, time.Since(t0))
					getCPU += devstack.ProcessCPU(s.st.DaprdPID()) - cpu
				}
				gets[i] = p50(get)
				b.Logf("%-8s %8d bytes: Get p50 %8v  Set p50 %8v  daprd CPU per Get %8v", s.name, size, gets[i].Round(time.Microsecond),
					p50(put).Round(time.Microsecond), (getCPU / time.Duration(n)).Round(time.Microsecond))
			}
			b.ReportMetric(float64(gets[0].Microseconds())/1000, fmt.Sprintf("get-%dB-ms", size))
			b.ReportMetric(float64(gets[1].Microseconds())/1000, fmt.Sprintf("upstream-get-%dB-ms", size))
		}
	}
}
