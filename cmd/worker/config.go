package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// config is the node's typed configuration, read from the environment.
type config struct {
	HTTPAddr          string        // WORKMANAGER_HTTP_ADDR
	TemporalAddress   string        // TEMPORAL_ADDRESS
	TemporalNamespace string        // TEMPORAL_NAMESPACE
	DaprGRPCAddress   string        // DAPR_GRPC_ADDRESS
	PubSub            string        // DAPR_PUBSUB
	StateStore        string        // DAPR_STATESTORE
	RecoveryOnStart   bool          // WORKER_RECOVERY_ON_START
	MaxConcurrency    int           // WORKER_MAX_CONCURRENCY
	WorkerTimeout     time.Duration // WORKER_TIMEOUT
	PythonProcesses   int           // PYTHON_PROCESSES
	PythonSpinWait    time.Duration // PYTHON_SPIN_WAIT (negative: never spin)
	ReconcileInterval time.Duration // RECONCILE_INTERVAL (0 disables)
	NodeID            string        // WORKMANAGER_NODE_ID (default: <hostname>-<pid>)
	NodeHeartbeat     time.Duration // NODE_HEARTBEAT; a node silent for 3 heartbeats counts as gone
	GatewayTimeout    time.Duration // GATEWAY_TIMEOUT
	NativeIsolation   string        // NATIVE_ISOLATION: "in-process" (default) or "process"
	NativeHostPath    string        // NATIVE_HOST_PATH (default: native-host next to this binary)
	NativeTempDir     string        // NATIVE_TEMP_DIR
	BrokerProbe       time.Duration // BROKER_PROBE_INTERVAL: how often an idle node checks that publishing works
	BrokerReadyGrace  time.Duration // BROKER_READY_GRACE: how long the broker may fail before /readyz does
	LogLevel          slog.Level    // LOG_LEVEL
}

func loadConfig() (config, error) {
	c := config{
		HTTPAddr:          env("WORKMANAGER_HTTP_ADDR", "127.0.0.1:8080"),
		TemporalAddress:   env("TEMPORAL_ADDRESS", "127.0.0.1:7233"),
		TemporalNamespace: env("TEMPORAL_NAMESPACE", "default"),
		DaprGRPCAddress:   env("DAPR_GRPC_ADDRESS", "127.0.0.1:50001"),
		PubSub:            env("DAPR_PUBSUB", "pubsub"),
		StateStore:        env("DAPR_STATESTORE", "statestore"),
		NativeIsolation:   env("NATIVE_ISOLATION", ""),
		NativeHostPath:    env("NATIVE_HOST_PATH", defaultHostPath()),
		NativeTempDir:     env("NATIVE_TEMP_DIR", ""),
		NodeID:            env("WORKMANAGER_NODE_ID", defaultNodeID()),
		NodeHeartbeat:     5 * time.Second,
	}
	var err error
	parse := func(name string, f func(string) error) {
		if v, ok := os.LookupEnv(name); ok && err == nil {
			if e := f(v); e != nil {
				err = fmt.Errorf("%s=%q: %w", name, v, e)
			}
		}
	}
	c.RecoveryOnStart, c.MaxConcurrency, c.WorkerTimeout, c.PythonProcesses, c.ReconcileInterval = true, 8, 30*time.Second, 1, 30*time.Second
	parse("WORKER_RECOVERY_ON_START", func(v string) (e error) { c.RecoveryOnStart, e = strconv.ParseBool(v); return })
	parse("WORKER_MAX_CONCURRENCY", func(v string) (e error) { c.MaxConcurrency, e = strconv.Atoi(v); return })
	parse("WORKER_TIMEOUT", func(v string) (e error) { c.WorkerTimeout, e = time.ParseDuration(v); return })
	parse("PYTHON_PROCESSES", func(v string) (e error) { c.PythonProcesses, e = strconv.Atoi(v); return })
	parse("PYTHON_SPIN_WAIT", func(v string) (e error) { c.PythonSpinWait, e = time.ParseDuration(v); return })
	c.GatewayTimeout = 30 * time.Second
	parse("GATEWAY_TIMEOUT", func(v string) (e error) { c.GatewayTimeout, e = time.ParseDuration(v); return })
	parse("RECONCILE_INTERVAL", func(v string) (e error) { c.ReconcileInterval, e = time.ParseDuration(v); return })
	parse("NODE_HEARTBEAT", func(v string) (e error) { c.NodeHeartbeat, e = time.ParseDuration(v); return })
	c.BrokerProbe, c.BrokerReadyGrace = 2*time.Second, 15*time.Second
	parse("BROKER_PROBE_INTERVAL", func(v string) (e error) { c.BrokerProbe, e = time.ParseDuration(v); return })
	parse("BROKER_READY_GRACE", func(v string) (e error) { c.BrokerReadyGrace, e = time.ParseDuration(v); return })
	parse("LOG_LEVEL", func(v string) error { return c.LogLevel.UnmarshalText([]byte(v)) })
	if err != nil {
		return c, err
	}
	return c, c.validate()
}

func (c config) validate() error {
	switch {
	case c.MaxConcurrency < 1:
		return fmt.Errorf("WORKER_MAX_CONCURRENCY must be at least 1, got %d", c.MaxConcurrency)
	case c.WorkerTimeout <= 0:
		return fmt.Errorf("WORKER_TIMEOUT must be positive, got %s", c.WorkerTimeout)
	case c.PythonProcesses < 1:
		return fmt.Errorf("PYTHON_PROCESSES must be at least 1, got %d", c.PythonProcesses)
	case c.ReconcileInterval < 0:
		return fmt.Errorf("RECONCILE_INTERVAL must not be negative, got %s", c.ReconcileInterval)
	case c.NativeIsolation != "" && c.NativeIsolation != "in-process" && c.NativeIsolation != "process":
		return fmt.Errorf(`NATIVE_ISOLATION must be "in-process" or "process", got %q`, c.NativeIsolation)
	case c.GatewayTimeout <= 0:
		return fmt.Errorf("GATEWAY_TIMEOUT must be positive, got %s", c.GatewayTimeout)
	case c.BrokerProbe <= 0:
		return fmt.Errorf("BROKER_PROBE_INTERVAL must be positive, got %s", c.BrokerProbe)
	case c.BrokerReadyGrace < 0:
		return fmt.Errorf("BROKER_READY_GRACE must not be negative, got %s", c.BrokerReadyGrace)
	case c.NodeHeartbeat <= 0:
		return fmt.Errorf("NODE_HEARTBEAT must be positive, got %s", c.NodeHeartbeat)
	case !validNodeID(c.NodeID):
		return fmt.Errorf("WORKMANAGER_NODE_ID must be 1 to 100 letters, digits, '.', '_' or '-', got %q", c.NodeID)
	case c.TemporalAddress == "" || c.DaprGRPCAddress == "" || c.HTTPAddr == "":
		return fmt.Errorf("TEMPORAL_ADDRESS, DAPR_GRPC_ADDRESS and WORKMANAGER_HTTP_ADDR must not be empty")
	}
	return nil
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// defaultNodeID is <hostname>-<pid>: unique among the nodes of one host, and
// readable in the Temporal UI (task queue workmanager-node-<id>).
func defaultNodeID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "node"
	}
	id := []byte(fmt.Sprintf("%s-%d", h, os.Getpid()))
	for i, c := range id {
		if !nodeIDChar(c) {
			id[i] = '-'
		}
	}
	return string(id)
}

func validNodeID(id string) bool {
	if id == "" || len(id) > 100 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if !nodeIDChar(id[i]) {
			return false
		}
	}
	return true
}

func nodeIDChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
}

// defaultHostPath is cmd/native-host's binary next to this one.
func defaultHostPath() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	return filepath.Join(filepath.Dir(exe), "native-host")
}
