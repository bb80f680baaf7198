package main

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"
)

// config is the API's typed configuration, read from the environment.
type config struct {
	Addr              string        // WORKMANAGER_API_ADDR
	TemporalAddress   string        // TEMPORAL_ADDRESS
	TemporalNamespace string        // TEMPORAL_NAMESPACE
	DaprGRPCAddress   string        // DAPR_GRPC_ADDRESS
	StateStore        string        // DAPR_STATESTORE
	OperationTimeout  time.Duration // WORKMANAGER_OPERATION_TIMEOUT
	// ContinueAsNewAfter: WORKMANAGER_CONTINUE_AS_NEW_AFTER (0: when the server suggests).
	ContinueAsNewAfter int
	LogLevel           slog.Level // LOG_LEVEL
}

func loadConfig() (config, error) {
	c := config{
		Addr:              env("WORKMANAGER_API_ADDR", "127.0.0.1:50051"),
		TemporalAddress:   env("TEMPORAL_ADDRESS", "127.0.0.1:7233"),
		TemporalNamespace: env("TEMPORAL_NAMESPACE", "default"),
		DaprGRPCAddress:   env("DAPR_GRPC_ADDRESS", "127.0.0.1:50001"),
		StateStore:        env("DAPR_STATESTORE", "statestore"),
		OperationTimeout:  60 * time.Second,
	}
	if v := os.Getenv("WORKMANAGER_OPERATION_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return c, fmt.Errorf("WORKMANAGER_OPERATION_TIMEOUT=%q: %w", v, err)
		}
		c.OperationTimeout = d
	}
	if v := os.Getenv("WORKMANAGER_CONTINUE_AS_NEW_AFTER"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return c, fmt.Errorf("WORKMANAGER_CONTINUE_AS_NEW_AFTER=%q: %w", v, err)
		}
		c.ContinueAsNewAfter = n
	}
	if v := os.Getenv("LOG_LEVEL"); v != "" {
		if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
			return c, fmt.Errorf("LOG_LEVEL=%q: %w", v, err)
		}
	}
	return c, c.validate()
}

func (c config) validate() error {
	switch {
	case c.Addr == "" || c.TemporalAddress == "" || c.DaprGRPCAddress == "" || c.StateStore == "":
		return fmt.Errorf("WORKMANAGER_API_ADDR, TEMPORAL_ADDRESS, DAPR_GRPC_ADDRESS and DAPR_STATESTORE must not be empty")
	case c.ContinueAsNewAfter < 0:
		return fmt.Errorf("WORKMANAGER_CONTINUE_AS_NEW_AFTER must not be negative, got %d", c.ContinueAsNewAfter)
	case c.OperationTimeout <= 0:
		return fmt.Errorf("WORKMANAGER_OPERATION_TIMEOUT must be positive, got %s", c.OperationTimeout)
	}
	return nil
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
