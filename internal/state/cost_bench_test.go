package state_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dapr "github.com/dapr/go-sdk/client"

	"github.com/virtufin/workmanager/internal/devstack"
)

// procCPU is the user+system CPU time of process pid so far.
func procCPU(tb testing.TB, pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond // USER_HZ 100
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDaprStateCost measures what one delivery-record read or write
// costs through the real daprd and Redis: CPU of daprd, Redis and this
// process per key, single calls against bulk calls of 8 keys, 8 callers.
func BenchmarkDaprStateCost(b *testing.B) {
	st, conn := devstack.StartT(b, devstack.Options{})
	c := dapr.NewClientWithConnection(conn)
	ctx := context.Background()
	const n, par, batch = 4000, 8, 8
	run := func(name string, op func(keys []string) error, per int) {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("workmanager/bench/%s/%d/%d", name, time.Now().UnixNano(), i)
		}
		d0, r0, s0, t0 := procCPU(b, st.DaprdPID()), procCPU(b, st.RedisPID()), selfCPU(), time.Now()
		var wg sync.WaitGroup
		for g := range par {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := g * per; i < n; i += par * per {
					if err := op(keys[i:min(i+per, n)]); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		el := time.Since(t0)
		d, r, s := procCPU(b, st.DaprdPID())-d0, procCPU(b, st.RedisPID())-r0, selfCPU()-s0
		b.Logf("%-12s %6.0f keys/s  CPU per key: daprd %5.1f µs  redis %4.1f µs  client %5.1f µs", name, n/el.Seconds(),
			float64(d.Microseconds())/n, float64(r.Microseconds())/n, float64(s.Microseconds())/n)
	}
	ttl := map[string]string{"ttlInSeconds": "600"}
	fw := dapr.WithConcurrency(dapr.StateConcurrencyFirstWrite)
	for range b.N {
		for range 2 {
			run("get", func(k []string) error { _, err := c.GetState(ctx, devstack.StateName, k[0], nil); return err }, 1)
			run("bulkget8", func(k []string) error { _, err := c.GetBulkState(ctx, devstack.StateName, k, nil, batch); return err }, batch)
			run("set", func(k []string) error {
				return c.SaveStateWithETag(ctx, devstack.StateName, k[0], []byte(`{"w":{"x":{"o":"done","a":1}}}`), "", ttl, fw)
			}, 1)
			run("bulkset8", func(k []string) error {
				items := make([]*dapr.SetStateItem, len(k))
				for i := range k {
					items[i] = &dapr.SetStateItem{Key: k[i], Value: []byte(`{"w":{"x":{"o":"done","a":1}}}`), Metadata: ttl,
						Options: &dapr.StateOptions{Concurrency: dapr.StateConcurrencyFirstWrite}}
				}
				return c.SaveBulkState(ctx, devstack.StateName, items...)
			}, batch)
			run("tx8", func(k []string) error {
				ops := make([]*dapr.StateOperation, len(k))
				for i := range k {
					ops[i] = &dapr.StateOperation{Type: dapr.StateOperationTypeUpsert, Item: &dapr.SetStateItem{Key: k[i], Value: []byte(`{"w":{"x":{"o":"done","a":1}}}`), Metadata: ttl}}
				}
				return c.ExecuteStateTransaction(ctx, devstack.StateName, nil, ops)
			}, batch)
		}
	}
}
