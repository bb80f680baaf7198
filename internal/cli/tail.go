package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/daprconn"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// listAllWorkers returns every page of ListWorkers.
func listAllWorkers(ctx context.Context, c pb.WorkManagerServiceClient, pageSize int32) ([]*pb.Worker, error) {
	var all []*pb.Worker
	token := ""
	seen := map[string]bool{}
	for {
		resp, err := c.ListWorkers(ctx, &pb.ListWorkersRequest{PageSize: pageSize, PageToken: token})
		if err != nil {
			return nil, err
		}
		all = append(all, resp.GetWorkers()...)
		token = resp.GetNextPageToken()
		if token == "" {
			return all, nil
		}
		if seen[token] {
			return nil, fmt.Errorf("the API answered page token %q twice", token)
		}
		seen[token] = true
	}
}

// subscriberCheckTimeout bounds publish's look for a running subscriber.
const subscriberCheckTimeout = 5 * time.Second

// warnWithoutSubscriber writes a warning to stderr when no running worker
// the caller can see subscribes to topic. It only warns: the API may be out
// of reach or the caller's credentials may not see every tenant, and a
// publish to a topic nobody consumes yet is legitimate (the stream keeps it).
func (a *app) warnWithoutSubscriber(ctx context.Context, topic string) {
	c, err := a.api()
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, subscriberCheckTimeout)
	defer cancel()
	ws, err := listAllWorkers(ctx, c, 0)
	if err != nil {
		return // no API at hand (publish needs only daprd): nothing to say
	}
	var stopped []string
	for _, w := range ws {
		if w.GetTopic() != topic {
			continue
		}
		if w.GetStatus() == pb.WorkerStatus_WORKER_STATUS_RUNNING {
			return
		}
		stopped = append(stopped, workerRef(w))
	}
	msg := fmt.Sprintf("wmctl: warning: no running worker subscribes to topic %q: the event waits in the topic until one does", topic)
	if len(stopped) > 0 {
		msg += fmt.Sprintf(" (stopped there: %s; wmctl start)", strings.Join(stopped, ", "))
	} else {
		msg += " (wmctl list shows the workers' topics; a typo?)"
	}
	fmt.Fprintln(a.io.Err, msg)
}

func workerRef(w *pb.Worker) string {
	if w.GetName() != "" {
		return w.GetName()
	}
	return w.GetWorkerId()
}

const tailLong = `Print the CloudEvents published to TOPIC as they arrive, through a Dapr
streaming subscription on the daprd at --dapr (the one 'wmctl events' uses):
the outputs of a worker (on the topic named by their type), a topic's dead
letters (<topic>-dead), any topic. One line per event: time, type, id,
correlationid and data; -o json prints one CloudEvent per line (id, source,
type, specversion, datacontenttype, extensions, data), -o yaml one YAML
document per event. Runs until interrupted (Ctrl-C: exit 0), or until
--count events were printed (then within --timeout, else exit 6).

What it reads, and what it refuses:
  - It reads through the Redis consumer group of daprd's app id (the nodes'
    daprd: "workmanager"), which is also how the nodes read their workers'
    input topics. So tailing a worker's input topic would take its messages
    away from the workers: wmctl looks the topic up through the API first and
    refuses a topic that a worker (running or stopped) subscribes to.
  - The group keeps what was published while nobody listened, and a new group
    starts at the beginning of the stream: daprd delivers that backlog first.
    wmctl acknowledges every event and skips those with a time older than
    --since before it started; events without a time are shown.
  - A daprd holds one subscription per topic: a second 'wmctl tail' of the
    same topic on the same daprd is refused.
  - After a tail has ended, daprd 1.14 keeps reading its topic for a while
    and hands what it reads to no one: such an event reaches the next tail
    only when daprd redelivers it, after the pub/sub's processingTimeout.`

func (a *app) tailCmd() *cobra.Command {
	var (
		count int
		since time.Duration
	)
	cmd := &cobra.Command{
		Use:   "tail TOPIC",
		Short: "Print the events arriving on a topic (a worker's outputs) through daprd",
		Long:  tailLong,
		Example: `  wmctl tail order.priced
  wmctl tail order.priced --since 10m --count 1 -o json
  wmctl tail orders-dead`,
		Args: cobra.ExactArgs(1),
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			topic := args[0]
			if err := catalog.ValidateTopic(topic); err != nil {
				return usageErr(err)
			}
			if since < 0 || count < 0 {
				return usageErr(errors.New("--since and --count must not be negative"))
			}
			var consumers []string
			err := a.apiCall(cmd.Context(), "", func(ctx context.Context, c pb.WorkManagerServiceClient) error {
				ws, err := listAllWorkers(ctx, c, 0)
				for _, w := range ws {
					if w.GetTopic() == topic {
						consumers = append(consumers, workerRef(w))
					}
				}
				return err
			})
			var re *remoteError
			if errors.As(err, &re) {
				re.what += fmt.Sprintf(" (checking that no worker consumes %q, which tailing it would take messages from)", topic)
			}
			if err != nil {
				return err
			}
			if len(consumers) > 0 {
				return usageErr(fmt.Errorf("topic %q is the input of %s: tailing it would take messages away from the workers "+
					"(daprd's consumer group is theirs); tail the topics of their outputs or <topic>-dead instead", topic, strings.Join(consumers, ", ")))
			}
			conn, err := daprconn.Dial(a.cfg.Dapr, daprconn.Options{Token: a.cfg.DaprToken})
			if err != nil {
				return usageErr(err)
			}
			defer conn.Close()
			ctx := cmd.Context()
			if count > 0 {
				// A cancel of our own, not a context deadline: gRPC would
				// send that to daprd, which may end the stream first.
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				defer cancel()
				defer time.AfterFunc(a.cfg.Timeout, cancel).Stop()
			}
			cutoff := time.Now().Add(-since)
			printed := 0
			err = a.subscribe(ctx, runtimev1.NewDaprClient(conn), topic, func(m *runtimev1.TopicEventRequest) (bool, error) {
				ev := cloudEventFrom(m)
				if !ev.when.IsZero() && ev.when.Before(cutoff) {
					return false, nil
				}
				if err := a.printCloudEvent(ev); err != nil {
					return true, err
				}
				printed++
				return count > 0 && printed >= count, nil
			})
			if err == nil && count > 0 && printed < count && cmd.Context().Err() == nil {
				return &remoteError{what: "daprd at " + a.cfg.Dapr, err: status.Errorf(codes.DeadlineExceeded,
					"%d of %d events on %q within --timeout %s", printed, count, topic, a.cfg.Timeout)}
			}
			return err
		}),
	}
	cmd.Flags().IntVarP(&count, "count", "n", 0, "exit after this many events (0: run until interrupted); waits at most --timeout")
	cmd.Flags().DurationVar(&since, "since", 5*time.Second, "also show events up to this long before the start that daprd still delivers")
	return cmd
}

// cloudEvent is one received event, as 'tail -o json' prints it.
type cloudEvent struct {
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	SpecVersion     string          `json:"specversion"`
	DataContentType string          `json:"datacontenttype,omitempty"`
	Extensions      map[string]any  `json:"extensions,omitempty"`
	Data            json.RawMessage `json:"data,omitempty"`

	when time.Time
}

func cloudEventFrom(m *runtimev1.TopicEventRequest) cloudEvent {
	ev := cloudEvent{ID: m.GetId(), Source: m.GetSource(), Type: m.GetType(), SpecVersion: m.GetSpecVersion(),
		DataContentType: m.GetDataContentType(), Extensions: m.GetExtensions().AsMap()}
	if t, ok := ev.Extensions["time"].(string); ok {
		if w, err := time.Parse(time.RFC3339Nano, t); err == nil {
			ev.when = w
		}
	}
	if d := m.GetData(); len(d) > 0 {
		if json.Valid(d) {
			ev.Data = d
		} else {
			ev.Data, _ = json.Marshal(string(d))
		}
	}
	return ev
}

func (a *app) printCloudEvent(ev cloudEvent) error {
	var out []byte
	switch a.output {
	case "json", "yaml":
		var err error
		if out, err = a.streamed(ev); err != nil {
			return err
		}
	default:
		when := "-"
		if !ev.when.IsZero() {
			when = ev.when.UTC().Format("2006-01-02T15:04:05.000Z")
		}
		corr, _ := ev.Extensions["correlationid"].(string)
		line := fmt.Sprintf("%-24s  %s  id=%s", when, ev.Type, strconv.Quote(ev.ID))
		if corr != "" {
			line += " correlationid=" + strconv.Quote(corr)
		}
		// What a keyed group (--group-key subject) serialises by.
		if subject, _ := ev.Extensions["subject"].(string); subject != "" {
			line += " subject=" + strconv.Quote(subject)
		}
		if len(ev.Data) > 0 {
			line += " data=" + compactJSON(ev.Data)
		}
		out = []byte(line + "\n")
	}
	_, err := a.io.Out.Write(out)
	return err
}

func compactJSON(b []byte) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return string(b)
	}
	return buf.String()
}
