// Package daemon owns how WorkManager's long-running commands start and end:
// typed configuration from the environment (exit code 2 with the reason when
// it is bad), a slog text logger at the configured level, a context that
// SIGINT or SIGTERM cancels, and exit code 1 when run fails.
package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// Main loads the configuration and runs the command named name until it
// returns or a signal arrives. It does not return.
func Main[C any](name string, load func() (C, error), level func(C) slog.Level, run func(context.Context, *slog.Logger, C) error) {
	cfg, err := load()
	if err != nil {
		fmt.Fprintf(os.Stderr, "workmanager %s: bad configuration: %v\n", name, err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level(cfg)}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err = run(ctx, log, cfg)
	stop()
	if err != nil {
		log.Error(name+" failed", "err", err)
		os.Exit(1)
	}
	os.Exit(0)
}
