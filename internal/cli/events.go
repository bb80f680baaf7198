package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
	"github.com/google/uuid"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/daprconn"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/tenant"
	"github.com/virtufin/workmanager/internal/workerpolicy"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// confirmTimeout bounds how long daprd may take to confirm a subscription.
const confirmTimeout = 10 * time.Second

const eventsLong = `Tail the lifecycle events (topic workmanager.lifecycle: created, started,
stopped, deleted, code_updated, error, dead_lettered) live through daprd's
streaming subscription, one line per event: time, type, worker id, details.
-o json prints one JSON object per line (id, type, source, time, subject,
tenant, data), -o yaml one YAML document per event. Runs until interrupted
(Ctrl-C: exit 0). Events are not stored, so --follow is required.

How the subscription behaves (Dapr with Redis streams):
  - It reads through the consumer group of daprd's app id (the nodes' daprd:
    "workmanager"). A daprd holds one subscription per topic, so a second
    'wmctl events' on the same daprd is refused; and two on daprds of the
    same app id share the events between them. To watch from several places,
    point --dapr at a daprd with an app id of its own.
  - The consumer group keeps what was published while nobody listened (and a
    new group starts at the beginning of the stream): those events are
    delivered first. wmctl acknowledges and skips every event older than
    --since before it started, so you see the live tail.`

func (a *app) eventsCmd() *cobra.Command {
	var (
		follow bool
		worker string
		since  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "events --follow",
		Short: "Tail the lifecycle events live through daprd",
		Long:  eventsLong,
		Example: `  wmctl events --follow
  wmctl events --follow --worker order-pricer -o json
  wmctl events --follow --dapr 127.0.0.1:50001 --since 10m`,
		Args: cobra.NoArgs,
		RunE: a.run(func(cmd *cobra.Command, _ []string) error {
			if !follow {
				return usageErr(errors.New("events are only streamed, never stored: pass --follow"))
			}
			if since < 0 {
				return usageErr(errors.New("--since must not be negative"))
			}
			cutoff := time.Now().Add(-since)
			filter := ""
			if worker != "" {
				id, err := a.resolveWorker(cmd.Context(), worker)
				if err != nil {
					return err
				}
				filter = id
			}
			conn, err := daprconn.Dial(a.cfg.Dapr, daprconn.Options{Token: a.cfg.DaprToken})
			if err != nil {
				return usageErr(err)
			}
			defer conn.Close()
			return a.follow(cmd.Context(), runtimev1.NewDaprClient(conn), lifecycleevents.Topic, filter, cutoff)
		}),
	}
	f := cmd.Flags()
	f.BoolVarP(&follow, "follow", "f", false, "stream the events (required)")
	f.StringVar(&worker, "worker", "", "only this worker's events: an id, or a name looked up through the API")
	f.DurationVar(&since, "since", 5*time.Second, "also show events up to this long before the start that daprd still delivers")
	return cmd
}

// resolveWorker returns the id whose events --worker asks for. A worker id
// is taken as it is (no API needed: a deleted worker's events, or a user
// with daprd only); a name is looked up through the API within --timeout,
// and a lookup that fails is an error: filtering on an unresolved name
// would silently show nothing.
func (a *app) resolveWorker(ctx context.Context, ref string) (string, error) {
	if _, _, ok := tenant.ParseWorkerID(ref); ok {
		return ref, nil
	}
	var id string
	err := a.apiCall(ctx, "", func(ctx context.Context, c pb.WorkManagerServiceClient) error {
		w, err := c.GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: ref})
		id = w.GetWorkerId()
		return err
	})
	var re *remoteError
	if errors.As(err, &re) {
		re.what += fmt.Sprintf(" (looking up --worker %q; pass the worker's id to follow without the API)", ref)
	}
	return id, err
}

// follow prints the events of topic until ctx ends (nil) or the stream
// fails. Every event is acknowledged, shown or not.
func (a *app) follow(parent context.Context, client runtimev1.DaprClient, topic, worker string, cutoff time.Time) error {
	return a.subscribe(parent, client, topic, func(m *runtimev1.TopicEventRequest) (bool, error) {
		ev := lifecycleFrom(m)
		if (ev.when.IsZero() || !ev.when.Before(cutoff)) && (worker == "" || ev.data.WorkerID == worker) {
			return false, a.printEvent(ev)
		}
		return false, nil
	})
}

// subscribe hands each event of topic to handle, which says whether to
// stop, until ctx ends or handle says stop (nil) or the stream or handle
// fails. Every event handed is acknowledged, also when handle fails.
func (a *app) subscribe(parent context.Context, client runtimev1.DaprClient, topic string, handle func(*runtimev1.TopicEventRequest) (bool, error)) error {
	what := "daprd at " + a.cfg.Dapr
	fail := func(err error) error {
		if parent.Err() != nil {
			return nil // interrupted
		}
		if s, ok := status.FromError(err); ok && strings.Contains(s.Message(), "already subscribed") {
			err = status.Error(s.Code(), s.Message()+" (daprd holds one subscription per topic: another 'wmctl events', 'wmctl tail' or subscriber uses it; see 'wmctl events --help')")
		}
		return &remoteError{what: what, err: err}
	}
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	st, err := client.SubscribeTopicEventsAlpha1(ctx)
	if err != nil {
		return fail(err)
	}
	err = st.Send(&runtimev1.SubscribeTopicEventsRequestAlpha1{
		SubscribeTopicEventsRequestType: &runtimev1.SubscribeTopicEventsRequestAlpha1_InitialRequest{
			InitialRequest: &runtimev1.SubscribeTopicEventsRequestInitialAlpha1{PubsubName: a.cfg.Pubsub, Topic: topic},
		},
	})
	if err != nil {
		return fail(err)
	}
	timer := time.AfterFunc(confirmTimeout, cancel)
	first, err := st.Recv()
	if !timer.Stop() && parent.Err() == nil {
		return &remoteError{what: what, err: status.Errorf(codes.DeadlineExceeded, "no confirmation of the subscription within %s", confirmTimeout)}
	}
	if err != nil {
		return fail(err)
	}
	if a.io.ErrIsTerminal {
		fmt.Fprintf(a.io.Err, "following %s on %s (pub/sub %q); Ctrl-C to stop\n", topic, what, a.cfg.Pubsub)
	}
	next := first.GetEventMessage() // usually nil: the initial response
	for {
		if next == nil {
			resp, err := st.Recv()
			if err != nil {
				return fail(err)
			}
			if next = resp.GetEventMessage(); next == nil {
				continue
			}
		}
		m := next
		next = nil
		stop, herr := handle(m)
		err := st.Send(&runtimev1.SubscribeTopicEventsRequestAlpha1{
			SubscribeTopicEventsRequestType: &runtimev1.SubscribeTopicEventsRequestAlpha1_EventProcessed{
				EventProcessed: &runtimev1.SubscribeTopicEventsRequestProcessedAlpha1{
					Id: m.GetId(), Status: &runtimev1.TopicEventResponse{Status: runtimev1.TopicEventResponse_SUCCESS},
				},
			},
		})
		if herr != nil {
			return herr
		}
		if err != nil {
			return fail(err)
		}
		if stop {
			// Half-close and let daprd end the stream, so that the last
			// acknowledgement is not cut off by the cancel (it would be
			// redelivered to the next subscriber of the group).
			_ = st.CloseSend()
			t := time.AfterFunc(time.Second, cancel)
			for {
				if _, err := st.Recv(); err != nil {
					break
				}
			}
			t.Stop()
			return nil
		}
	}
}

// lifecycleEvent is one received event, as printed by -o json.
type lifecycleEvent struct {
	ID      string          `json:"id"`
	Type    string          `json:"type"`
	Source  string          `json:"source"`
	Time    string          `json:"time,omitempty"`
	Subject string          `json:"subject,omitempty"`
	Tenant  string          `json:"tenant,omitempty"`
	Data    json.RawMessage `json:"data,omitempty"`

	when time.Time
	data lifecycleevents.Data
}

func lifecycleFrom(m *runtimev1.TopicEventRequest) lifecycleEvent {
	x := m.GetExtensions().GetFields()
	ev := lifecycleEvent{ID: m.GetId(), Type: m.GetType(), Source: m.GetSource(),
		Time: x["time"].GetStringValue(), Subject: x["subject"].GetStringValue(), Tenant: x["tenant"].GetStringValue()}
	if t, err := time.Parse(time.RFC3339Nano, ev.Time); err == nil {
		ev.when = t
	}
	if d := m.GetData(); len(d) > 0 {
		if json.Valid(d) {
			ev.Data = d
			_ = json.Unmarshal(d, &ev.data)
		} else {
			ev.Data, _ = json.Marshal(string(d))
		}
	}
	return ev
}

// streamed is v as one item of a stream in -o json (a line) or yaml (a
// document), for the commands that print as things arrive (events, tail).
func (a *app) streamed(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if a.output == "json" {
		return append(b, '\n'), nil
	}
	y, err := jsonToYAML(b)
	if err != nil {
		return nil, err
	}
	return append([]byte("---\n"), y...), nil
}

func (a *app) printEvent(ev lifecycleEvent) error {
	var out []byte
	switch a.output {
	case "json", "yaml":
		var err error
		if out, err = a.streamed(ev); err != nil {
			return err
		}
	default:
		out = []byte(eventLine(ev) + "\n")
	}
	_, err := a.io.Out.Write(out)
	return err
}

// eventLine is the human form: time, type, worker id, details.
func eventLine(ev lifecycleEvent) string {
	when := ev.Time
	if !ev.when.IsZero() {
		when = ev.when.UTC().Format("2006-01-02T15:04:05.000Z")
	}
	d := ev.data
	var kv []string
	add := func(k, v string) {
		if v != "" {
			if strings.ContainsAny(v, " \t\"=") {
				v = strconv.Quote(v)
			}
			kv = append(kv, k+"="+v)
		}
	}
	add("name", d.WorkerName)
	add("topic", d.Topic)
	add("group", d.Group)
	if d.CodeVersion != 0 {
		add("version", strconv.FormatInt(d.CodeVersion, 10))
	}
	if d.Tenant != "" && d.Tenant != "default" {
		add("tenant", d.Tenant)
	}
	add("event", d.EventID)
	if d.Attempt != 0 {
		add("attempt", fmt.Sprintf("%d/%d", d.Attempt, d.MaxAttempts))
	}
	add("reason", d.Reason)
	add("error_type", d.ErrorType)
	add("where", short(lastFrame(d.Traceback), 120))
	add("error", short(d.ErrorMessage, 200))
	return fmt.Sprintf("%-24s  %-13s  %-36s  %s", when, strings.TrimPrefix(ev.Type, lifecycleevents.TypePrefix),
		dash(d.WorkerID), strings.Join(kv, " "))
}

func (a *app) publishCmd() *cobra.Command {
	var (
		typ, data, id, corr, source, subject string
		exts                                 []string
	)
	cmd := &cobra.Command{
		Use:   "publish TOPIC",
		Short: "Publish a test CloudEvent to a topic through daprd; prints its id",
		Long: `Publish a CloudEvent to TOPIC through daprd, as a structured CloudEvent
(application/cloudevents+json), so that its id, type, source, subject and
extensions (correlationid, --ext) arrive as given: --subject is what a
worker keyed on it (--group-key subject) serialises by. Prints the event's id (-o json/yaml:
the event). When no running worker subscribes to TOPIC (as far as the API,
when it is reachable, lists the caller's workers) a warning goes to stderr;
the exit code is still 0: the topic keeps the event for a later subscriber.
'wmctl tail' shows what the workers publish.`,
		Example: `  wmctl publish orders --type order.placed --data '{"items":[{"sku":"a","price":2,"qty":3}]}' --correlation-id c-42
  wmctl publish orders --id o-1 --data @order.json
  wmctl publish orders --subject order-7 --data '{"items":[]}'`,
		Args: cobra.ExactArgs(1),
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			// The rules a worker's topic follows, and never WorkManager's
			// own topics: a lifecycle event or a dead letter sent by hand
			// would be taken for a real one.
			if err := catalog.ValidateTopic(args[0]); err != nil {
				return usageErr(err)
			}
			if workerpolicy.Reserved(args[0]) {
				return usageErr(fmt.Errorf("topic %q is reserved (%s* and *%s carry WorkManager's own lifecycle events and dead letters); "+
					"to send a dead letter to its worker again use wmctl replay-dead", args[0], workerpolicy.ReservedPrefix, workerpolicy.DeadSuffix))
			}
			ev := event.New(event.CloudEventsVersionV1)
			if id == "" {
				id = uuid.NewString()
			}
			ev.SetID(id)
			ev.SetSource(source)
			ev.SetType(typ)
			if subject != "" {
				ev.SetSubject(subject)
			}
			ev.SetTime(time.Now().UTC())
			if data != "" {
				b := []byte(data)
				if strings.HasPrefix(data, "@") {
					var err error
					if b, err = os.ReadFile(data[1:]); err != nil {
						return usageErr(fmt.Errorf("--data: %w", err))
					}
				}
				if !json.Valid(b) {
					return usageErr(errors.New("--data is not valid JSON"))
				}
				// As JSON, not base64: SetData would take []byte as binary.
				if err := ev.SetData(event.ApplicationJSON, json.RawMessage(b)); err != nil {
					return usageErr(err)
				}
			}
			if corr != "" {
				ev.SetExtension("correlationid", corr)
			}
			sort.Strings(exts)
			for _, kv := range exts {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return usageErr(fmt.Errorf("--ext %q: want name=value", kv))
				}
				if err := ev.Context.SetExtension(k, v); err != nil {
					return usageErr(fmt.Errorf("--ext %q: %v", kv, err))
				}
			}
			if err := ev.Validate(); err != nil {
				return usageErr(err)
			}
			body, err := ev.MarshalJSON()
			if err != nil {
				return err
			}
			conn, err := daprconn.Dial(a.cfg.Dapr, daprconn.Options{Token: a.cfg.DaprToken})
			if err != nil {
				return usageErr(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), a.cfg.Timeout)
			defer cancel()
			_, err = runtimev1.NewDaprClient(conn).PublishEvent(ctx, &runtimev1.PublishEventRequest{
				PubsubName: a.cfg.Pubsub, Topic: args[0], Data: body, DataContentType: "application/cloudevents+json"})
			if err != nil {
				return &remoteError{what: "daprd at " + a.cfg.Dapr, timeout: a.cfg.Timeout, err: err}
			}
			a.warnWithoutSubscriber(cmd.Context(), args[0])
			return a.emit(func() ([]byte, error) { return indentJSON(body) }, func(w io.Writer) { fmt.Fprintln(w, id) })
		}),
	}
	f := cmd.Flags()
	f.StringVar(&typ, "type", "wmctl.test", "CloudEvent type")
	f.StringVar(&data, "data", "", "JSON data (or @FILE)")
	f.StringVar(&id, "id", "", "CloudEvent id (default: a new UUID)")
	f.StringVar(&corr, "correlation-id", "", "the correlationid extension")
	f.StringVar(&source, "source", "wmctl", "CloudEvent source")
	f.StringVar(&subject, "subject", "", "CloudEvent subject (what a worker with --group-key subject serialises by)")
	f.StringSliceVar(&exts, "ext", nil, "more extensions, name=value (repeat or comma-separate)")
	return cmd
}
