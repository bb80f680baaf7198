package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// codeFlags are the ways to give a worker's code besides a FILE argument.
type codeFlags struct {
	url, sha256 string
}

func (c *codeFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&c.url, "url", "", "fetch the code from this URL (the node checks it against --sha256) instead of FILE")
	cmd.Flags().StringVar(&c.sha256, "sha256", "", "lowercase hex SHA-256 of the code at --url")
}

// source builds the CodeSource from FILE (args, "-" for stdin) or --url,
// and returns the file name and content for MIME inference.
func (c *codeFlags) source(a *app, args []string) (*pb.CodeSource, string, []byte, error) {
	hasFile := len(args) > 0
	if err := exactlyOne("give the code either as FILE or with --url and --sha256", hasFile, c.url != ""); err != nil {
		return nil, "", nil, err
	}
	if c.url != "" {
		return &pb.CodeSource{Source: &pb.CodeSource_Url{Url: &pb.UrlSource{Url: c.url, Sha256: c.sha256}}}, "", nil, nil
	}
	if c.sha256 != "" {
		return nil, "", nil, usageErr(errors.New("--sha256 goes with --url"))
	}
	name := args[0]
	var content []byte
	var err error
	if name == "-" {
		content, err = io.ReadAll(a.io.In)
	} else {
		content, err = os.ReadFile(name)
	}
	if err != nil {
		return nil, "", nil, usageErr(fmt.Errorf("code: %w", err))
	}
	if len(content) == 0 {
		return nil, "", nil, usageErr(fmt.Errorf("code file %s is empty", name))
	}
	return &pb.CodeSource{Source: &pb.CodeSource_Content{Content: content}}, name, content, nil
}

func (a *app) createCmd() *cobra.Command {
	var (
		code           codeFlags
		req            pb.CreateWorkerRequest
		mime           string
		maxAttempts    int32
		backoff        time.Duration
		outputs, gates []string
		replicas       string
		require        map[string]string
		maxConc        int32
		maxProcs       int32
		eventTimeout   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "create FILE --topic TOPIC [flags]",
		Short: "Create a worker from a file, a package or a URL; it ends RUNNING",
		Long: `Create a worker from FILE ("-": standard input) or from --url with --sha256,
and print its id. Without --mime the MIME type is told from the file:
  .py text/x-python, .cs text/x-csharp, .dll and .nupkg application/x-dotnet-dll,
  .wasm application/wasm (a WebAssembly module, sdk/wasm),
  .zip: a manifest.json at its root is a native package (application/x-native-dll),
        a lib/<tfm>/*.dll layout or a .nuspec a .NET package (application/x-dotnet-dll).`,
		Example: `  wmctl create worker.py --topic orders --group shop --name order-pricer
  wmctl create Pricer.cs --topic orders --allowed-output-topics 'order.*' --max-attempts 5 --backoff 2s
  wmctl create build/echo.zip --topic raw
  wmctl create worker.py --topic frames --replicas 3 --require pool=gpu,zone=a
  wmctl create fetcher.py --topic urls --max-concurrency 64
  wmctl create --url https://example.com/w.py --sha256 9f86d08… --topic orders`,
		Args: cobra.MaximumNArgs(1),
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			src, name, content, err := code.source(a, args)
			if err != nil {
				return err
			}
			req.Code = src
			req.MimeType = mime
			if mime == "" {
				switch {
				case code.url != "":
					req.MimeType, err = InferMIMEFromURL(code.url)
				case name == "-":
					err = errors.New("code from standard input: pass --mime")
				default:
					req.MimeType, err = InferMIME(name, content)
				}
				if err != nil {
					return usageErr(err)
				}
			}
			if maxAttempts != 0 || backoff != 0 {
				if backoff < 0 {
					return usageErr(errors.New("--backoff must not be negative"))
				}
				req.RetryPolicy = &pb.RetryPolicy{MaxAttempts: maxAttempts, BackoffMs: backoff.Milliseconds()}
			}
			req.AllowedOutputTopics, req.AllowedGatewayTargets = outputs, gates
			if flagChanged(cmd.Flags(), "replicas") {
				r, err := parseReplicas(replicas)
				if err != nil {
					return err
				}
				req.Replicas = &r
			}
			if len(require) > 0 {
				req.Placement = &pb.WorkerPlacement{Require: require}
			}
			if flagChanged(cmd.Flags(), "max-concurrency") {
				req.MaxConcurrency = &maxConc
			}
			if flagChanged(cmd.Flags(), "max-processes") {
				req.MaxProcesses = &maxProcs
			}
			if flagChanged(cmd.Flags(), "event-timeout") {
				if eventTimeout <= 0 || eventTimeout%time.Millisecond != 0 {
					return usageErr(fmt.Errorf("--event-timeout %s: want a positive duration in whole milliseconds, e.g. 5s", eventTimeout))
				}
				ms := eventTimeout.Milliseconds()
				req.TimeoutMs = &ms
			}
			var resp *pb.CreateWorkerResponse
			err = a.apiCall(cmd.Context(), "creating worker", func(ctx context.Context, c pb.WorkManagerServiceClient) (err error) {
				resp, err = c.CreateWorker(ctx, &req)
				return err
			})
			if err != nil {
				return sourceNamed(err, name)
			}
			return a.emitMessage(resp, func(w io.Writer) { fmt.Fprintln(w, resp.GetWorkerId()) })
		}),
	}
	f := cmd.Flags()
	f.StringVar(&req.Topic, "topic", "", "topic the worker subscribes to (required)")
	f.StringVar(&req.Group, "group", "", "group: workers of one group process one message at a time (group lock)")
	f.StringVar(&req.GroupKey, "group-key", "", "with --group: a CloudEvent attribute or extension (e.g. subject) whose value keys the lock: one message at a time per key, keys in parallel")
	f.StringVar(&req.Name, "name", "", "unique name, usable wherever an id is (a-z 0-9 -, starting with a letter)")
	f.StringVar(&mime, "mime", "", "MIME type (default: told from FILE)")
	f.StringVar(&req.RequestId, "request-id", "", "idempotency key: a retry with the same key answers the same worker")
	f.StringSliceVar(&outputs, "allowed-output-topics", nil, "topics (patterns, e.g. 'billing.*') the worker may publish to; default any")
	f.StringSliceVar(&gates, "allowed-gateway-targets", nil, "'service/method' patterns the worker's gateway calls may reach; default any")
	f.Int32Var(&maxAttempts, "max-attempts", 0, "attempts per message before it is dead-lettered, 1..100 (default: the cluster's)")
	f.DurationVar(&backoff, "backoff", 0, "wait before the next attempt, e.g. 2s (default: the cluster's)")
	f.Int32Var(&maxConc, "max-concurrency", 0, "Python: `N` events an async def worker runs at once (1..256; default: the cluster's PYTHON_MAX_CONCURRENCY)")
	f.Int32Var(&maxProcs, "max-processes", 0, "Python, .NET: up to `N` processes a worker with slow events gets on demand (1..16; default: the cluster's PYTHON_MAX_PROCESSES or DOTNET_MAX_PROCESSES)")
	f.DurationVar(&eventTimeout, "event-timeout", 0, "the longest one event may run in the worker, e.g. 5s (up to 1h, capped by each node's WORKER_TIMEOUT; default: WORKER_TIMEOUT)")
	f.StringVar(&replicas, "replicas", "", "how many nodes serve the worker's topic: `N|all` (1..64, or every node that can run it; default: the cluster's PLACEMENT_REPLICAS)")
	f.StringToStringVar(&require, "require", nil, "labels (NODE_LABELS) a node must have to run the worker, as `k=v[,k=v]`")
	f.Lookup("require").DefValue = "" // none; not "[]"
	code.add(cmd)
	_ = cmd.MarkFlagRequired("topic")
	return cmd
}

func (a *app) listCmd() *cobra.Command {
	var pageSize int32
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List workers (every page); -o json/yaml prints an array of workers",
		Example: `  wmctl list
  wmctl list -o json | jq -r '.[] | select(.status=="WORKER_STATUS_RUNNING") | .workerId'`,
		Args: cobra.NoArgs,
		RunE: a.run(func(cmd *cobra.Command, _ []string) error {
			var all []*pb.Worker
			err := a.apiCall(cmd.Context(), "", func(ctx context.Context, c pb.WorkManagerServiceClient) error {
				token := ""
				seen := map[string]bool{}
				for {
					resp, err := c.ListWorkers(ctx, &pb.ListWorkersRequest{PageSize: pageSize, PageToken: token})
					if err != nil {
						return err
					}
					all = append(all, resp.GetWorkers()...)
					token = resp.GetNextPageToken()
					if token == "" {
						return nil
					}
					if seen[token] {
						return fmt.Errorf("the API answered page token %q twice", token)
					}
					seen[token] = true
				}
			})
			if err != nil {
				return err
			}
			return a.emit(func() ([]byte, error) { return listJSON(all) }, workersTable(all))
		}),
	}
	cmd.Flags().Int32Var(&pageSize, "page-size", 0, "workers per ListWorkers call, 1..1000 (default: the API's, 1000)")
	return cmd
}

func (a *app) getCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "get ID",
		Short:             "Show a worker (by id or name)",
		Example:           "  wmctl get order-pricer\n  wmctl get 3f2c… -o yaml",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeWorkers,
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			var w *pb.Worker
			err := a.apiCall(cmd.Context(), "", func(ctx context.Context, c pb.WorkManagerServiceClient) (err error) {
				w, err = c.GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: args[0]})
				return err
			})
			if err != nil {
				return err
			}
			return a.emitMessage(w, workerDetail(w))
		}),
	}
}

// workerOp is a command that changes one worker and answers it.
func (a *app) workerOp(use, short, wait string, call func(context.Context, pb.WorkManagerServiceClient, string) (*pb.Worker, error)) *cobra.Command {
	return &cobra.Command{
		Use:               use + " ID",
		Short:             short,
		Example:           "  wmctl " + use + " order-pricer",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeWorkers,
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			var w *pb.Worker
			err := a.apiCall(cmd.Context(), wait, func(ctx context.Context, c pb.WorkManagerServiceClient) (err error) {
				w, err = call(ctx, c, args[0])
				return err
			})
			if err != nil {
				return err
			}
			return a.emitMessage(w, workersTable([]*pb.Worker{w}))
		}),
	}
}

func (a *app) startCmd() *cobra.Command {
	return a.workerOp("start", "Start (resume) a worker; idempotent", "starting worker",
		func(ctx context.Context, c pb.WorkManagerServiceClient, id string) (*pb.Worker, error) {
			return c.StartWorker(ctx, &pb.StartWorkerRequest{WorkerId: id})
		})
}

func (a *app) stopCmd() *cobra.Command {
	return a.workerOp("stop", "Stop a worker (it keeps its config); idempotent", "stopping worker",
		func(ctx context.Context, c pb.WorkManagerServiceClient, id string) (*pb.Worker, error) {
			return c.StopWorker(ctx, &pb.StopWorkerRequest{WorkerId: id})
		})
}

func (a *app) deleteCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "delete ID",
		Aliases:           []string{"rm"},
		Short:             "Delete a worker",
		Example:           "  wmctl delete order-pricer",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeWorkers,
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			var resp *pb.DeleteWorkerResponse
			err := a.apiCall(cmd.Context(), "deleting worker", func(ctx context.Context, c pb.WorkManagerServiceClient) (err error) {
				resp, err = c.DeleteWorker(ctx, &pb.DeleteWorkerRequest{WorkerId: args[0]})
				return err
			})
			if err != nil {
				return err
			}
			return a.emitMessage(resp, func(w io.Writer) { fmt.Fprintln(w, "deleted", args[0]) })
		}),
	}
}

func (a *app) reloadCmd() *cobra.Command {
	var (
		code     codeFlags
		force    bool
		groupKey string
	)
	cmd := &cobra.Command{
		Use:   "reload ID FILE",
		Short: "Load new code into a worker (hot reload, a new version; the MIME type stays)",
		Long: `Load new code into a worker: a hot reload, a new version. The worker keeps
its MIME type, so the code must be of the same kind: wmctl asks the API for
the worker's MIME type and refuses a file (or --url) whose kind, told as
create tells it, is another one (--force sends it anyway). To run code of
another kind, create a new worker.`,
		Example: `  wmctl reload order-pricer worker.py
  wmctl reload order-pricer --url https://example.com/w.py --sha256 9f86d08…`,
		Args: cobra.RangeArgs(1, 2),
		ValidArgsFunction: func(cmd *cobra.Command, args []string, s string) ([]string, cobra.ShellCompDirective) {
			if len(args) == 1 {
				return nil, cobra.ShellCompDirectiveDefault // FILE
			}
			return a.completeWorkers(cmd, args, s)
		},
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			src, name, content, err := code.source(a, args[1:])
			if err != nil {
				return err
			}
			if !force {
				if err := a.checkReloadKind(cmd.Context(), args[0], code.url, name, content); err != nil {
					return err
				}
			}
			var w *pb.Worker
			err = a.apiCall(cmd.Context(), "loading code", func(ctx context.Context, c pb.WorkManagerServiceClient) (err error) {
				req := &pb.LoadCodeRequest{WorkerId: args[0], Code: src}
				if cmd.Flags().Changed("group-key") {
					req.GroupKey = &groupKey
				}
				w, err = c.LoadCode(ctx, req)
				return err
			})
			if err != nil {
				return sourceNamed(err, name)
			}
			return a.emitMessage(w, workersTable([]*pb.Worker{w}))
		}),
	}
	code.add(cmd)
	cmd.Flags().BoolVar(&force, "force", false, "send the code even when its kind does not match the worker's MIME type")
	cmd.Flags().StringVar(&groupKey, "group-key", "", "the worker's group key from this version on (\"\" removes it; unset keeps it)")
	return cmd
}

// checkReloadKind refuses code whose kind (told from the file or URL as
// create tells it) is not the worker's MIME type: the engine would only
// fail on it (Python code given to the C# compiler, ...). Code whose kind
// cannot be told is sent as it is.
func (a *app) checkReloadKind(ctx context.Context, ref, url, name string, content []byte) error {
	var kind string
	var err error
	switch {
	case url != "":
		kind, err = InferMIMEFromURL(url)
	case name == "-":
		return nil
	default:
		kind, err = InferMIME(name, content)
	}
	if err != nil {
		return nil
	}
	var w *pb.Worker
	err = a.apiCall(ctx, "", func(ctx context.Context, c pb.WorkManagerServiceClient) (err error) {
		w, err = c.GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: ref})
		return err
	})
	if err != nil {
		return err
	}
	if have := w.GetMimeType(); have != "" && have != kind {
		what := name
		if url != "" {
			what = url
		}
		return usageErr(fmt.Errorf("worker %s runs %s code but %s is %s: reload keeps a worker's MIME type; "+
			"create a new worker for it (wmctl create %s --topic %s), or pass --force to send it anyway", ref, have, what, kind, what, w.GetTopic()))
	}
	return nil
}

// sourceNamed shows a C# compiler message with the file the user sent: the
// engine compiles a C# source under the name Worker.cs (the API carries no
// file name).
func sourceNamed(err error, name string) error {
	if name == "" || name == "-" || !strings.EqualFold(filepath.Ext(name), ".cs") {
		return err
	}
	s, ok := grpcStatus(err)
	if !ok || s.Code() != codes.InvalidArgument || !strings.Contains(s.Message(), dotnetSourceName+":") {
		return err
	}
	renamed := status.Error(s.Code(), strings.ReplaceAll(s.Message(), dotnetSourceName+":", filepath.Base(name)+":"))
	var re *remoteError
	if errors.As(err, &re) {
		return &remoteError{what: re.what, timeout: re.timeout, err: renamed}
	}
	return renamed
}

// dotnetSourceName is the name the .NET engine gives a C# source worker in
// compiler messages (engines/dotnet).
const dotnetSourceName = "Worker.cs"

func (a *app) historyCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "history ID",
		Short:             "List a worker's code versions, oldest first; -o json/yaml prints an array of entries",
		Example:           "  wmctl history order-pricer",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeWorkers,
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			var es []*pb.HistoryEntry
			err := a.apiCall(cmd.Context(), "", func(ctx context.Context, c pb.WorkManagerServiceClient) error {
				// Every page (at most 1000 entries each), as list does.
				token := ""
				seen := map[string]bool{}
				for {
					resp, err := c.GetWorkerHistory(ctx, &pb.GetWorkerHistoryRequest{WorkerId: args[0], PageToken: token})
					if err != nil {
						return err
					}
					es = append(es, resp.GetEntries()...)
					token = resp.GetNextPageToken()
					if token == "" {
						return nil
					}
					if seen[token] {
						return fmt.Errorf("the API answered history page token %q twice", token)
					}
					seen[token] = true
				}
			})
			if err != nil {
				return err
			}
			return a.emit(func() ([]byte, error) { return listJSON(es) }, historyTable(es))
		}),
	}
}

func (a *app) rollbackCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "rollback ID VERSION",
		Short:             "Load the code of an earlier version again, as a new version",
		Example:           "  wmctl rollback order-pricer 2",
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: a.completeWorkers,
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			v, err := strconv.ParseInt(args[1], 10, 64)
			if err != nil || v < 1 {
				return usageErr(fmt.Errorf("VERSION %q is not a version number (see wmctl history)", args[1]))
			}
			var w *pb.Worker
			err = a.apiCall(cmd.Context(), "rolling back", func(ctx context.Context, c pb.WorkManagerServiceClient) (err error) {
				w, err = c.RollbackWorker(ctx, &pb.RollbackWorkerRequest{WorkerId: args[0], Version: v})
				return err
			})
			if err != nil {
				return err
			}
			return a.emitMessage(w, workersTable([]*pb.Worker{w}))
		}),
	}
}

func (a *app) recoverCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "recover",
		Short: "Run the cluster-wide recovery of every worker (admin)",
		Args:  cobra.NoArgs,
		RunE: a.run(func(cmd *cobra.Command, _ []string) error {
			var resp *pb.RecoverWorkersResponse
			err := a.apiCall(cmd.Context(), "recovering workers", func(ctx context.Context, c pb.WorkManagerServiceClient) (err error) {
				resp, err = c.RecoverWorkers(ctx, &pb.RecoverWorkersRequest{})
				return err
			})
			if err != nil {
				return err
			}
			return a.emitMessage(resp, func(w io.Writer) {
				fmt.Fprintf(w, "recovered %d, failed %d\n", resp.GetRecovered(), resp.GetFailed())
			})
		}),
	}
}

func (a *app) deadLettersCmd() *cobra.Command {
	var (
		req  pb.ListDeadLettersRequest
		wait bool
	)
	cmd := &cobra.Command{
		Use:     "dead-letters ID",
		Aliases: []string{"dead"},
		Short:   "List a worker's stored dead letters, oldest first, each with where it failed; -o json/yaml prints an array (with the whole traceback)",
		Example: `  wmctl dead-letters order-pricer
  wmctl dead order-pricer --reason worker_failed --limit 10
  wmctl dead-letters order-pricer --wait --timeout 2m   # the next new one`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeWorkers,
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			req.WorkerId = args[0]
			var ds []*pb.DeadLetter
			if wait {
				var err error
				if ds, err = a.waitDeadLetters(cmd.Context(), &req); err != nil {
					return err
				}
			} else {
				err := a.apiCall(cmd.Context(), "", func(ctx context.Context, c pb.WorkManagerServiceClient) error {
					resp, err := c.ListDeadLetters(ctx, &req)
					ds = resp.GetDeadLetters()
					return err
				})
				if err != nil {
					return err
				}
			}
			return a.emit(func() ([]byte, error) { return listJSON(ds) }, deadLettersTable(ds))
		}),
	}
	cmd.Flags().StringVar(&req.Reason, "reason", "", "only this reason (worker_failed, timeout, lock_contention, not_runnable, panic, …)")
	cmd.Flags().Int32Var(&req.Limit, "limit", 0, "at most this many, 1..1000 (default 100)")
	cmd.Flags().BoolVarP(&wait, "wait", "w", false, "wait for the next new dead letter (one from the last 10 s counts; within --timeout, else exit 6) and print it")
	return cmd
}

func (a *app) replayDeadCmd() *cobra.Command {
	var req pb.ReplayDeadLettersRequest
	cmd := &cobra.Command{
		Use:   "replay-dead [ID]",
		Short: "Republish stored dead letters to the worker they died for, with fresh attempts",
		Long: `Republish stored dead letters, oldest first, to their topic for the one worker
they died for, with fresh attempts, and remove them from the store. Give
exactly one of a worker (ID or --worker) and --topic (every worker on it).`,
		Example: `  wmctl replay-dead order-pricer
  wmctl replay-dead --topic orders --reason timeout --limit 50
  wmctl replay-dead order-pricer --event-id o-1,o-7`,
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: a.completeWorkers,
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if req.WorkerId != "" {
					return usageErr(errors.New("give the worker as ID or with --worker, not both"))
				}
				req.WorkerId = args[0]
			}
			if err := exactlyOne("give exactly one of a worker (ID or --worker) and --topic", req.WorkerId != "", req.Topic != ""); err != nil {
				return err
			}
			var resp *pb.ReplayDeadLettersResponse
			err := a.apiCall(cmd.Context(), "replaying dead letters", func(ctx context.Context, c pb.WorkManagerServiceClient) (err error) {
				resp, err = c.ReplayDeadLetters(ctx, &req)
				return err
			})
			if err != nil {
				return err
			}
			return a.emitMessage(resp, func(w io.Writer) {
				fmt.Fprintf(w, "replayed %d, remaining %d\n", resp.GetReplayed(), resp.GetRemaining())
				for _, id := range resp.GetEventIds() {
					fmt.Fprintln(w, id)
				}
			})
		}),
	}
	f := cmd.Flags()
	f.StringVar(&req.WorkerId, "worker", "", "the worker (id or name) whose dead letters to replay")
	f.StringVar(&req.Topic, "topic", "", "replay for every worker on this topic")
	f.StringVar(&req.Reason, "reason", "", "only this reason")
	f.StringSliceVar(&req.EventIds, "event-id", nil, "only these CloudEvent ids (repeat or comma-separate)")
	f.Int32Var(&req.Limit, "limit", 0, "at most this many, 1..1000 (default 100)")
	return cmd
}

// NodeLogFile is where 'make run' writes its node's log, relative to the
// working directory: the default of 'wmctl logs --file'.
const NodeLogFile = ".run/node.log"

func (a *app) logsCmd() *cobra.Command {
	var (
		follow bool
		file   string
	)
	cmd := &cobra.Command{
		Use:   "logs ID [--follow]",
		Short: "Print a worker's lines from its node's log (make run: .run/node.log)",
		Long: `Print the lines of a node's log that belong to one worker: what its code
wrote (print, logging at its level, tracebacks) and what the node logged
about it (failed attempts, dead letters, restarts). A name is looked up
through the API; an id is taken as it is (a deleted worker's lines).

WorkManager does not collect logs: each node writes its own to stderr, one
record per line with worker_id=<id>. This command reads one node's log file,
by default .run/node.log in the working directory (what 'make run' writes);
in a cluster read the nodes' logs where your log collector keeps them and
filter on worker_id.`,
		Example: `  wmctl logs order-pricer
  wmctl logs order-pricer --follow
  wmctl logs 6f1c2f6e-8a51-4f0e-9a43-0c7a3c1f2b11 --file /var/log/workmanager/node.log`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeWorkers,
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			id, err := a.resolveWorker(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if file == "" {
				file = NodeLogFile
				if a.opts.WorkDir != "" {
					file = filepath.Join(a.opts.WorkDir, NodeLogFile)
				}
			}
			f, err := os.Open(file)
			if err != nil {
				return usageErr(fmt.Errorf("the node's log: %w (under make run it is %s in the repository root; elsewhere pass --file)", err, NodeLogFile))
			}
			defer f.Close()
			return followLog(cmd.Context(), f, id, follow, a.io.Out)
		}),
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing the worker's new lines until interrupted")
	cmd.Flags().StringVar(&file, "file", "", "the node's log file (default "+NodeLogFile+" in the working directory)")
	return cmd
}

// logPollInterval is how often 'logs --follow' looks for new lines.
const logPollInterval = 200 * time.Millisecond

// maxLogLineBytes bounds one line held while looking for its end: a longer
// one is dropped (a node's records are at most 16 KiB of worker text).
const maxLogLineBytes = 1 << 20

// followLog copies to w the lines of r that carry worker_id=id, until r's
// end, or with follow until ctx ends (nil).
func followLog(ctx context.Context, r io.Reader, id string, follow bool, w io.Writer) error {
	mid, tail := " worker_id="+id+" ", " worker_id="+id
	var pending []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		pending = append(pending, buf[:n]...)
		for {
			i := bytes.IndexByte(pending, '\n')
			if i < 0 {
				break
			}
			line := pending[:i]
			if bytes.Contains(line, []byte(mid)) || bytes.HasSuffix(line, []byte(tail)) {
				if _, werr := w.Write(pending[:i+1]); werr != nil {
					return werr
				}
			}
			pending = pending[i+1:]
		}
		if len(pending) > maxLogLineBytes {
			pending = pending[:0]
		}
		pending = append([]byte(nil), pending...)
		switch {
		case err == nil:
			continue
		case !errors.Is(err, io.EOF):
			return err
		case !follow:
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(logPollInterval):
		}
	}
}

// completeWorkers completes worker names and ids for shell completion.
func (a *app) completeWorkers(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 || a.loadConfig(cmd.Flags()) != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c, err := a.api()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 3*time.Second)
	defer cancel()
	resp, err := c.ListWorkers(ctx, &pb.ListWorkersRequest{})
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, w := range resp.GetWorkers() {
		if w.GetName() != "" {
			out = append(out, w.GetName()+"\t"+w.GetTopic())
		}
		out = append(out, w.GetWorkerId()+"\t"+w.GetTopic())
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// parseReplicas reads --replicas: a count, or "all" (0: every node that
// can run the worker).
func parseReplicas(s string) (int32, error) {
	if strings.EqualFold(s, "all") {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || n < 0 {
		return 0, usageErr(fmt.Errorf("--replicas %q must be a number of nodes (1..64) or 'all'", s))
	}
	return int32(n), nil
}
