package state_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	dapr "github.com/dapr/go-sdk/client"

	"github.com/virtufin/workmanager/internal/devstack"
)

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
		d0, r0, s0, t0 := devstack.ProcessCPU(st.DaprdPID()), devstack.ProcessCPU(st.RedisPID()), devstack.SelfCPU(), time.Now()
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
		d, r, s := devstack.ProcessCPU(st.DaprdPID())-d0, devstack.ProcessCPU(st.RedisPID())-r0, devstack.SelfCPU()-s0
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
