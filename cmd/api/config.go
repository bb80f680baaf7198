package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/virtufin/workmanager/internal/envconfig"
)

// config is the API's typed configuration, read from the environment.
type config struct {
	envconfig.Services
	Addr             string        // WORKMANAGER_API_ADDR
	OperationTimeout time.Duration // WORKMANAGER_OPERATION_TIMEOUT
	// ContinueAsNewAfter: WORKMANAGER_CONTINUE_AS_NEW_AFTER (0: when the server suggests).
	ContinueAsNewAfter int
	LogLevel           slog.Level // LOG_LEVEL
}

func loadConfig() (config, error) {
	r := envconfig.New()
	c := config{
		Services:           r.Services(),
		Addr:               r.String("WORKMANAGER_API_ADDR", "127.0.0.1:50051"),
		OperationTimeout:   r.Duration("WORKMANAGER_OPERATION_TIMEOUT", 60*time.Second),
		ContinueAsNewAfter: r.Int("WORKMANAGER_CONTINUE_AS_NEW_AFTER", 0),
		LogLevel:           r.LogLevel("LOG_LEVEL"),
	}
	if err := r.Err(); err != nil {
		return c, err
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
