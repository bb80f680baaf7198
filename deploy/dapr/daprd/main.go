// Command daprd is Dapr's sidecar, v1.14.0, built with -tags stablecomponents,
// with one component replaced: "pubsub.redis" is redisstreams, upstream's
// Redis streams pub/sub with bounded XREADGROUP blocks (see its package
// comment: upstream leaks one Redis connection per closed subscription).
//
// DAPRD_UPSTREAM_REDIS_PUBSUB=1 keeps upstream's component instead, to
// measure the difference side by side (docs/scaling.md).
package main

import (
	"os"

	"github.com/dapr/dapr/cmd/daprd/app"
	pubsubLoader "github.com/dapr/dapr/pkg/components/pubsub"

	"github.com/virtufin/workmanager/deploy/dapr/daprd/redisstreams"
)

// init runs after every imported package's init, so this registration
// replaces the upstream "redis" pub/sub that app's components registered.
func init() {
	if os.Getenv("DAPRD_UPSTREAM_REDIS_PUBSUB") != "1" {
		pubsubLoader.DefaultRegistry.RegisterComponent(redisstreams.NewRedisStreams, "redis")
	}
}

func main() { app.Run() }
