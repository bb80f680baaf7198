package main

import (
	"os"

	"github.com/dapr/components-contrib/nameresolution/kubernetes"
	"github.com/dapr/components-contrib/nameresolution/mdns"
	redisPubSub "github.com/dapr/components-contrib/pubsub/redis"
	redisState "github.com/dapr/components-contrib/state/redis"
	nrLoader "github.com/dapr/dapr/pkg/components/nameresolution"
	pubsubLoader "github.com/dapr/dapr/pkg/components/pubsub"
	stateLoader "github.com/dapr/dapr/pkg/components/state"

	"github.com/virtufin/workmanager/deploy/dapr/daprd/redisstate"
	"github.com/virtufin/workmanager/deploy/dapr/daprd/redisstreams"
)

// optionalComponents are registered after the others: components built in
// only with a build tag (components_kafka.go).
var optionalComponents []func()

// registerComponents registers the only components this daprd has: the
// ones WorkManager uses and documents. Add a component by adding one line
// (its loader and name as in dapr's cmd/daprd/components/<kind>_<name>.go).
func registerComponents() {
	// pubsub.redis is ours (bounded XREADGROUP blocks, see redisstreams);
	// DAPRD_UPSTREAM_REDIS_PUBSUB=1 keeps upstream's, to measure the
	// difference side by side (docs/scaling.md).
	if os.Getenv("DAPRD_UPSTREAM_REDIS_PUBSUB") == "1" {
		pubsubLoader.DefaultRegistry.RegisterComponent(redisPubSub.NewRedisStreams, "redis")
	} else {
		pubsubLoader.DefaultRegistry.RegisterComponent(redisstreams.NewRedisStreams, "redis")
	}
	// state.redis is ours too (values read without a round trip through
	// %q, see redisstate); DAPRD_UPSTREAM_REDIS_STATE=1 keeps upstream's
	// (BenchmarkDaprStateGetBySize runs both).
	if os.Getenv("DAPRD_UPSTREAM_REDIS_STATE") == "1" {
		stateLoader.DefaultRegistry.RegisterComponent(redisState.NewRedisStateStore, "redis")
	} else {
		stateLoader.DefaultRegistry.RegisterComponent(redisstate.NewRedisStateStore, "redis")
	}
	nrLoader.DefaultRegistry.RegisterComponent(mdns.NewResolver, "mdns")             // self-hosted
	nrLoader.DefaultRegistry.RegisterComponent(kubernetes.NewResolver, "kubernetes") // Kubernetes
	for _, register := range optionalComponents {
		register()
	}
}
