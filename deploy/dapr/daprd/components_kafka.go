//go:build kafka

package main

import (
	kafkaPubSub "github.com/dapr/components-contrib/pubsub/kafka"
	pubsubLoader "github.com/dapr/dapr/pkg/components/pubsub"
)

// pubsub.kafka, for the Kafka overlay (deploy/k8s/overlays/kafka): built
// into the sidecar image (deploy/k8s/Dockerfile builds with -tags kafka),
// not into the daprd of `make run` and the tests, which use Redis. Kafka's
// client and its AWS and compression libraries are about a ninth of
// daprd's compile: left out, a fresh machine's first `make run` is that
// much shorter (issue 31).
func init() {
	optionalComponents = append(optionalComponents, func() {
		pubsubLoader.DefaultRegistry.RegisterComponent(kafkaPubSub.NewKafka, "kafka")
	})
}
