package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"gopkg.in/yaml.v3"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// jsonOptions render messages as the API's JSON (lowerCamelCase names, as
// grpcurl prints them), every field present so that scripts see a stable
// shape.
var jsonOptions = protojson.MarshalOptions{EmitUnpopulated: true}

// messageJSON is m as indented JSON.
func messageJSON(m proto.Message) ([]byte, error) {
	raw, err := jsonOptions.Marshal(m)
	if err != nil {
		return nil, err
	}
	return indentJSON(raw)
}

// listJSON is ms as one indented JSON array.
func listJSON[M proto.Message](ms []M) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('[')
	for i, m := range ms {
		if i > 0 {
			buf.WriteByte(',')
		}
		raw, err := jsonOptions.Marshal(m)
		if err != nil {
			return nil, err
		}
		buf.Write(raw)
	}
	buf.WriteByte(']')
	return indentJSON(buf.Bytes())
}

func indentJSON(raw []byte) ([]byte, error) {
	var out bytes.Buffer
	if err := json.Indent(&out, raw, "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// jsonToYAML converts a JSON document to block-style YAML, keeping the
// order of its keys.
func jsonToYAML(doc []byte) ([]byte, error) {
	var n yaml.Node
	if err := yaml.Unmarshal(doc, &n); err != nil {
		return nil, err
	}
	plain(&n)
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&n); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// plain drops the JSON (flow, double-quoted) styles the decoder recorded;
// the encoder quotes what needs it.
func plain(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		plain(c)
	}
}

// emit writes doc (JSON) in the run's format; table is the human form.
func (a *app) emit(doc func() ([]byte, error), table func(w io.Writer)) error {
	switch a.output {
	case "json", "yaml":
		b, err := doc()
		if err != nil {
			return err
		}
		if a.output == "yaml" {
			if b, err = jsonToYAML(b); err != nil {
				return err
			}
		}
		_, err = a.io.Out.Write(b)
		return err
	default:
		tw := tabwriter.NewWriter(a.io.Out, 0, 4, 2, ' ', 0)
		table(tw)
		return tw.Flush()
	}
}

// emitMessage writes one message: its JSON or YAML, or table.
func (a *app) emitMessage(m proto.Message, table func(w io.Writer)) error {
	return a.emit(func() ([]byte, error) { return messageJSON(m) }, table)
}

func statusName(s pb.WorkerStatus) string {
	return strings.TrimPrefix(s.String(), "WORKER_STATUS_")
}

func ts(t *timestamppb.Timestamp) string {
	if t == nil || (t.GetSeconds() == 0 && t.GetNanos() == 0) {
		return "-"
	}
	return t.AsTime().UTC().Format(time.RFC3339)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func workersTable(ws []*pb.Worker) func(io.Writer) {
	return func(w io.Writer) {
		fmt.Fprintln(w, "ID\tNAME\tTOPIC\tGROUP\tSTATUS\tVERSION\tMIME\tUPDATED")
		for _, x := range ws {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", x.GetWorkerId(), dash(x.GetName()), x.GetTopic(), dash(x.GetGroup()),
				statusName(x.GetStatus()), x.GetCodeVersion(), x.GetMimeType(), ts(x.GetUpdatedAt()))
		}
	}
}

// workerDetail is one worker, a field per line.
func workerDetail(x *pb.Worker) func(io.Writer) {
	return func(w io.Writer) {
		retry := "cluster default"
		if rp := x.GetRetryPolicy(); rp.GetMaxAttempts() != 0 || rp.GetBackoffMs() != 0 {
			retry = fmt.Sprintf("max attempts %s, backoff %s", orDefault(int64(rp.GetMaxAttempts()), ""),
				orDefault(rp.GetBackoffMs(), "ms"))
		}
		rows := [][2]string{
			{"ID", x.GetWorkerId()},
			{"Name", dash(x.GetName())},
			{"Tenant", dash(x.GetTenant())},
			{"Status", statusName(x.GetStatus())},
			{"Topic", x.GetTopic()},
			{"Group", dash(x.GetGroup())},
			{"Group key", dash(x.GetGroupKey())},
			{"MIME type", x.GetMimeType()},
			{"Code version", strconv.FormatInt(x.GetCodeVersion(), 10)},
			{"Code SHA-256", dash(x.GetCodeSha256())},
			{"Retry policy", retry},
			{"Allowed output topics", listOrAny(x.GetAllowedOutputTopics())},
			{"Allowed gateway targets", listOrAny(x.GetAllowedGatewayTargets())},
			{"Replicas", replicasText(x)},
			{"Placement", placementText(x.GetPlacement())},
			{"Max concurrency", optionalText(x.MaxConcurrency)},
			{"Max processes", optionalText(x.MaxProcesses)},
			{"Timeout", timeoutText(x.TimeoutMs)},
			{"Nodes", nodesText(x)},
			{"Created", ts(x.GetCreatedAt())},
			{"Updated", ts(x.GetUpdatedAt())},
		}
		if r := x.GetStatusReason(); r != "" {
			// Quarantined, or not recovered: why it does not do what its
			// status says (right under the status).
			rows = slices.Insert(rows, 4, [2]string{"Status reason", r})
		}
		if r := x.GetPlacementReason(); r != "" {
			// Why no node can run it (right under its nodes).
			i := slices.IndexFunc(rows, func(r [2]string) bool { return r[0] == "Nodes" })
			rows = slices.Insert(rows, i+1, [2]string{"Placement reason", r})
		}
		rows = append(rows, statsRows(x.GetStats())...)
		for _, r := range rows {
			fmt.Fprintf(w, "%s:\t%s\n", r[0], r[1])
		}
	}
}

func orDefault(v int64, unit string) string {
	if v == 0 {
		return "default"
	}
	return strconv.FormatInt(v, 10) + unit
}

func listOrAny(l []string) string {
	if len(l) == 0 {
		return "any"
	}
	return strings.Join(l, ", ")
}

func historyTable(es []*pb.HistoryEntry) func(io.Writer) {
	return func(w io.Writer) {
		fmt.Fprintln(w, "VERSION\tACTION\tROLLBACK TO\tSOURCE\tSHA256\tACTOR\tCREATED")
		for _, e := range es {
			rb := "-"
			if e.GetRollbackTo() != 0 {
				rb = strconv.FormatInt(e.GetRollbackTo(), 10)
			}
			src := dash(e.GetSourceKind())
			if e.GetUrl() != "" {
				src += " " + e.GetUrl()
			}
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", e.GetVersion(), dash(e.GetAction()), rb, src,
				short(e.GetSha256(), 13), dash(e.GetActor()), ts(e.GetCreatedAt()))
		}
	}
}

func deadLettersTable(ds []*pb.DeadLetter) func(io.Writer) {
	return func(w io.Writer) {
		fmt.Fprintln(w, "EVENT ID\tTOPIC\tREASON\tATTEMPTS\tAT\tSOURCE\tLAST FRAME\tERROR")
		for _, d := range ds {
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", d.GetEventId(), d.GetTopic(), d.GetReason(), d.GetAttempts(),
				ts(d.GetAt()), dash(d.GetSource()), dash(short(lastFrame(d.GetTraceback()), 60)), dash(short(d.GetError(), 60)))
		}
	}
}

// replicasText is a worker's replicas as get shows them.
func replicasText(x *pb.Worker) string {
	switch {
	case x.Replicas == nil:
		return "cluster default"
	case x.GetReplicas() == 0:
		return "all (every node that can run it)"
	}
	return strconv.Itoa(int(x.GetReplicas()))
}

// placementText is what a worker asks of its nodes.
func placementText(p *pb.WorkerPlacement) string {
	if len(p.GetRequire()) == 0 {
		return "any node"
	}
	return "require " + labelsText(p.GetRequire())
}

// labelsText is labels as k=v,k=v, sorted ("-": none).
func labelsText(l map[string]string) string {
	if len(l) == 0 {
		return "-"
	}
	kv := make([]string, 0, len(l))
	for k, v := range l {
		kv = append(kv, k+"="+v)
	}
	slices.Sort(kv)
	return strings.Join(kv, ",")
}

// nodesText is the nodes serving a worker's topic now.
func nodesText(x *pb.Worker) string {
	if len(x.GetNodes()) == 0 {
		return "none"
	}
	return strings.Join(x.GetNodes(), ", ")
}

func nodesTable(ns []*pb.Node) func(io.Writer) {
	return func(w io.Writer) {
		fmt.Fprintln(w, "NODE\tALIVE\tDRAINED\tLABELS\tENGINES\tWORKERS\tTOPICS\tMEMORY")
		for _, n := range ns {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", n.GetId(), yesNo(n.GetAlive()), yesNo(n.GetDrained()),
				labelsText(n.GetLabels()), dash(strings.Join(n.GetEngines(), ",")), n.GetWorkers(), n.GetTopics(), bytesText(n.GetMemoryBytes()))
		}
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// bytesText is a memory size in binary units ("-": unknown).
func bytesText(b uint64) string {
	if b == 0 {
		return "-"
	}
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit && exp < 4; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTP"[exp])
}

// optionalText is an optional count, or "cluster default" when unset.
// timeoutText is a worker's timeout_ms as GetWorker shows it.
func timeoutText(ms *int64) string {
	if ms == nil {
		return "WORKER_TIMEOUT"
	}
	return (time.Duration(*ms) * time.Millisecond).String()
}

func optionalText(n *int32) string {
	if n == nil {
		return "cluster default"
	}
	return strconv.Itoa(int(*n))
}
