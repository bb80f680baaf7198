package validate

import (
	"strconv"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

// nodeProcessMargin is the memory a node needs beside its workers' (the
// node process, about 0.4 MiB per worker and 36 MiB idle, measured; and
// in-flight messages and engine peaks): docs/scaling.md, "Sizing and
// quotas".
const nodeProcessMargin = 1 << 30

// TestNodeMemoryFitsTheQuotas (issue 46 item 4): every node runs every
// running worker, so each node must hold the memory the API's
// cluster-wide quota admits (QUOTA_MEMORY_TOTAL_BYTES, the workers'
// estimated memory) plus the node's own; the quotas are on; and the
// node's memory request equals its limit (a node that uses more than it
// requested is the kubelet's first to evict, and all nodes use the same).
func TestNodeMemoryFitsTheQuotas(t *testing.T) {
	eachBuild(t, func(t *testing.T, v *variant) {
		quota := func(name string) int64 {
			s, ok := v.c.value(v.apiEnv, name)
			n, err := strconv.ParseInt(s, 10, 64)
			if !ok || err != nil || n <= 0 {
				v.c.errorf("api: %s=%q: the quotas must be on in a cluster (a positive number; 0 is unlimited, for make run only)", name, s)
			}
			return n
		}
		total := quota("QUOTA_MEMORY_TOTAL_BYTES")
		quota("QUOTA_WORKERS_TOTAL")
		quota("QUOTA_WORKERS_PER_TENANT")
		if perTenant := quota("QUOTA_MEMORY_PER_TENANT_BYTES"); perTenant > total {
			v.c.errorf("api: QUOTA_MEMORY_PER_TENANT_BYTES %d exceeds QUOTA_MEMORY_TOTAL_BYTES %d", perTenant, total)
		}
		nc := container(v.node, nodeContainer)
		limit, request := nc.Resources.Limits.Memory(), nc.Resources.Requests.Memory()
		if limit == nil || limit.IsZero() {
			v.c.errorf("node: no memory limit")
			return
		}
		if need := resource.NewQuantity(total+nodeProcessMargin, resource.BinarySI); limit.Cmp(*need) < 0 {
			v.c.errorf("node: memory limit %s is below QUOTA_MEMORY_TOTAL_BYTES (%d) + %d for the node itself: every node runs every worker the quota admits (docs/scaling.md, \"Sizing and quotas\")",
				limit, total, nodeProcessMargin)
		}
		if request == nil || request.Cmp(*limit) != 0 {
			v.c.errorf("node: memory request %v differs from its limit %s: every node holds every worker, so each uses about the same; request what it uses", request, limit)
		}
	})
}
