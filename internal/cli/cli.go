// Package cli is wmctl, WorkManager's command line: cobra commands over the
// control API (workmanager.v1.WorkManagerService) and, for events and
// publish, over daprd; its configuration (flags, environment, config file),
// output formats and exit codes. cmd/wmctl only wires it to the process.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// IO is where a command reads and writes.
type IO struct {
	In  io.Reader
	Out io.Writer
	Err io.Writer
	// ErrIsTerminal turns the progress spinner on (stderr is a terminal).
	ErrIsTerminal bool
}

// Options shape one run; the zero value is the process's own environment.
type Options struct {
	IO IO
	// Getenv reads the environment (nil: os.Getenv).
	Getenv func(string) string
	// WorkDir is where .run/dev-token is looked for ("": the working
	// directory).
	WorkDir string
}

// Main runs wmctl with args (without the program name) and returns the
// process exit code; errors are printed as "wmctl: <message>" on o.IO.Err.
func Main(ctx context.Context, args []string, o Options) int {
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.IO.In == nil {
		o.IO.In = os.Stdin
	}
	a := &app{opts: o, io: o.IO}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetIn(o.IO.In)
	root.SetOut(o.IO.Out)
	root.SetErr(o.IO.Err)
	cmd, err := root.ExecuteContextC(ctx)
	if cmd != nil {
		a.cmdPath = cmd.CommandPath()
	}
	if a.conn != nil {
		a.conn.Close()
	}
	if err == nil {
		return ExitOK
	}
	if !a.started && !isUsage(err) {
		err = usageErr(err) // rejected before the command ran: flags, arguments, configuration
	}
	code := ExitCode(err)
	fmt.Fprintln(o.IO.Err, "wmctl: "+Message(err)+a.credentialsHint(err))
	if code == ExitUsage && a.cmdPath != "" {
		fmt.Fprintf(o.IO.Err, "Run '%s --help' for usage.\n", a.cmdPath)
	}
	return code
}

// credentialsHint adds to an UNAUTHENTICATED answer what was sent: where
// the token came from, or, when nothing was, how to pass the dev token
// (found by itself only in the working directory).
func (a *app) credentialsHint(err error) string {
	s, ok := grpcStatus(err)
	if !ok || s.Code() != codes.Unauthenticated {
		return ""
	}
	switch {
	case a.cfg.Token != "":
		return " (the token sent came from " + a.cfg.TokenFrom + ")"
	case a.cfg.Cert != "":
		return " (the client certificate sent was " + a.cfg.Cert + ")"
	}
	where := "<repository>/" + DevTokenFile
	if p := findUp(a.opts.WorkDir, DevTokenFile); p != "" {
		where = p
	}
	return " (no credentials were sent: wmctl sends " + DevTokenFile + " by itself only from the directory 'make run' ran in; " +
		"elsewhere pass --token-file " + where + " or set WMCTL_TOKEN_FILE=" + where + ", or WMCTL_TOKEN / a config file, see wmctl --help)"
}

// findUp looks for rel in dir and its parents and returns the first path
// that exists, or "".
func findUp(dir, rel string) string {
	if dir == "" {
		dir, _ = os.Getwd()
	}
	dir, _ = filepath.Abs(dir)
	for dir != "" {
		p := filepath.Join(dir, rel)
		if _, err := os.Stat(p); err == nil {
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return ""
}

// app is the state of one run.
type app struct {
	opts    Options
	io      IO
	cfg     Config
	output  string
	started bool   // a command's RunE began: later errors are not usage errors
	cmdPath string // the command that ran, for the usage hint
	conn    *grpc.ClientConn
	client  pb.WorkManagerServiceClient
}

const rootLong = `wmctl controls a WorkManager cluster through its control API
(workmanager.v1.WorkManagerService) and watches it through daprd.

Connection and credentials, each from a flag, else the environment, else the
config file, else the default:
  --addr        WMCTL_ADDR        addr        (default 127.0.0.1:50051)
  --token       WMCTL_TOKEN       token       bearer token
  --token-file  WMCTL_TOKEN_FILE  token_file  file holding the bearer token
  --tls         WMCTL_TLS         tls         TLS (on by itself with --ca, --cert or --key)
  --ca          WMCTL_CA          ca          CA certificate(s) to trust (PEM)
  --cert/--key  WMCTL_CERT/_KEY   cert/key    client certificate and key (mTLS)
  --dapr        DAPR_GRPC_ADDRESS dapr        daprd gRPC address, for events, publish and tail
  --pubsub      DAPR_PUBSUB                   Dapr pub/sub component (default pubsub)
daprd's API token, when it requires one, is read from DAPR_API_TOKEN.
The config file is --config, else WMCTL_CONFIG, else
$XDG_CONFIG_HOME/wmctl/config.yaml (~/.config/wmctl/config.yaml).
With neither a token nor a token file anywhere, wmctl sends the token in
.run/dev-token of the current directory when there is one (what 'make run'
writes), so 'wmctl list' works from the repository root right after 'make run'.

Exit codes: 0 ok, 1 other error, 2 usage or configuration error, 3 not found,
4 not authenticated or permission denied, 5 invalid argument, failed
precondition, already exists or a code URL the server refuses, 6 server (API or daprd) not reachable or no
answer in time.`

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "wmctl",
		Short:         "Control WorkManager workers",
		Long:          rootLong,
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if p := cmd.Parent(); p != nil && p.Name() == "completion" {
				return nil // scripts need no connection settings
			}
			if err := a.checkOutput(); err != nil {
				return err
			}
			return a.loadConfig(cmd.Flags())
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageErr(err) })
	pf := root.PersistentFlags()
	pf.String("addr", defaultAddr, "control API address (host:port)")
	pf.String("token", "", "bearer token")
	pf.String("token-file", "", "file holding the bearer token (default: "+DevTokenFile+" when it exists and no token is configured)")
	pf.Bool("tls", false, "connect with TLS (implied by --ca, --cert and --key)")
	pf.String("ca", "", "CA certificate file (PEM) to verify the API's certificate")
	pf.String("cert", "", "client certificate file (PEM), for mTLS")
	pf.String("key", "", "client key file (PEM), for mTLS")
	pf.Duration("timeout", defaultTimeout, "how long a command may take (not events --follow)")
	pf.String("config", "", "config file (default $XDG_CONFIG_HOME/wmctl/config.yaml)")
	pf.String("dapr", defaultDapr, "daprd gRPC address, for events, publish and tail")
	pf.String("pubsub", defaultPubsub, "Dapr pub/sub component name, for events, publish and tail")
	pf.StringVarP(&a.output, "output", "o", "table", "output format: table, json or yaml")

	root.AddGroup(&cobra.Group{ID: "workers", Title: "Workers:"}, &cobra.Group{ID: "messages", Title: "Messages and events:"})
	for _, c := range []*cobra.Command{a.createCmd(), a.listCmd(), a.getCmd(), a.startCmd(), a.stopCmd(), a.deleteCmd(),
		a.reloadCmd(), a.historyCmd(), a.rollbackCmd(), a.recoverCmd(), a.logsCmd()} {
		c.GroupID = "workers"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{a.deadLettersCmd(), a.replayDeadCmd(), a.eventsCmd(), a.publishCmd(), a.tailCmd()} {
		c.GroupID = "messages"
		root.AddCommand(c)
	}
	root.AddGroup(&cobra.Group{ID: "cluster", Title: "Nodes:"})
	for _, c := range []*cobra.Command{a.nodesCmd(), a.drainCmd()} {
		c.GroupID = "cluster"
		root.AddCommand(c)
	}
	root.AddGroup(&cobra.Group{ID: "develop", Title: "Writing workers (on this machine, no cluster):"})
	for _, c := range []*cobra.Command{a.newCmd(), a.runCmd()} {
		c.GroupID = "develop"
		root.AddCommand(c)
	}
	return root
}

// run wraps a command's body: from here on its errors are not usage errors.
func (a *app) run(f func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		a.started = true
		return f(cmd, args)
	}
}

func (a *app) checkOutput() error {
	switch a.output {
	case "table", "json", "yaml":
		return nil
	}
	return usageErr(fmt.Errorf("unknown output format %q: use table, json or yaml", a.output))
}

// api returns the control API client, connecting on first use.
func (a *app) api() (pb.WorkManagerServiceClient, error) {
	if a.client == nil {
		conn, err := dial(a.cfg)
		if err != nil {
			return nil, err
		}
		a.conn, a.client = conn, pb.NewWorkManagerServiceClient(conn)
	}
	return a.client, nil
}

// apiCall runs f against the API within --timeout, with a spinner saying
// what is going on when wait is non-empty.
func (a *app) apiCall(ctx context.Context, wait string, f func(context.Context, pb.WorkManagerServiceClient) error) error {
	c, err := a.api()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	if wait != "" {
		stop := startSpinner(a.io.Err, a.io.ErrIsTerminal, wait)
		defer stop()
	}
	if err := f(ctx, c); err != nil {
		return &remoteError{what: "the API at " + a.cfg.Addr, timeout: a.cfg.Timeout, err: err}
	}
	return nil
}

// flagChanged says whether the user set the flag name on the command line.
func flagChanged(fs *pflag.FlagSet, name string) bool {
	f := fs.Lookup(name)
	return f != nil && f.Changed
}

// exactlyOne says the user gave exactly one of the named things.
func exactlyOne(what string, given ...bool) error {
	n := 0
	for _, g := range given {
		if g {
			n++
		}
	}
	if n != 1 {
		return usageErr(errors.New(what))
	}
	return nil
}

// short shortens s to n runes with an ellipsis.
func short(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

const (
	defaultAddr    = "127.0.0.1:50051"
	defaultDapr    = "127.0.0.1:50001"
	defaultPubsub  = "pubsub"
	defaultTimeout = 60 * time.Second
)
