// Command wmctl is WorkManager's command line (internal/cli): it creates,
// controls and inspects workers through the control API and tails events
// through daprd. See cmd/wmctl/README.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/virtufin/workmanager/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], cli.Options{IO: cli.IO{
		In: os.Stdin, Out: os.Stdout, Err: os.Stderr, ErrIsTerminal: cli.IsTerminal(os.Stderr),
	}})
	stop()
	os.Exit(code)
}
