package integration

import (
	"encoding/json"
	"errors"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	dapr "github.com/dapr/go-sdk/client"

	"github.com/virtufin/workmanager/internal/devstack"
	"github.com/virtufin/workmanager/internal/publish"
)

// The broker's fence through the real daprd and Redis (deploy/dapr/daprd
// redisstreams, change 12): outputs of a group lock whose token is below
// one already published on the topic are refused whole (publish.ErrFenced)
// and never reach a subscriber — what a node paused between its lock check
// and its publish runs into when it wakes; equal and higher tokens, and
// another lock's, go out in order.
func TestBrokerFenceRefusesAStaleToken(t *testing.T) {
	e := sharedEnv(t)
	pub := publish.NewDapr(dapr.NewClientWithConnection(e.dapr), devstack.PubSubName)
	pub.MaxLen = publish.DefaultStreamMaxLen
	topic := topicName(t, "out")
	out := func(id string, tok int64) *event.Event {
		o := event.New(event.CloudEventsVersionV1)
		o.SetID(id)
		o.SetSource("test/fence")
		o.SetType(topic)
		o.SetExtension(publish.FencingExtension, strconv.FormatInt(tok, 10))
		return &o
	}
	fenced := func(lock string, es ...*event.Event) error {
		return pub.PublishFenced(ctxT(t), topic, lock, es)
	}
	if err := fenced("t/g", out("a", 300), out("b", 301)); err != nil {
		t.Fatal(err)
	}
	err := fenced("t/g", out("stale", 299))
	if !errors.Is(err, publish.ErrFenced) {
		t.Fatalf("token 299 after 301: %v, want ErrFenced", err)
	}
	t.Logf("refused: %v", err)
	if err := fenced("t/g", out("c", 301), out("d", 560)); err != nil {
		t.Fatal(err)
	}
	if err := fenced("t/other", out("e", 1)); err != nil {
		t.Fatal(err)
	}
	// Unfenced outputs (an ungrouped worker's) are not checked.
	if err := pub.Publish(ctxT(t), topic, out("f", 2)); err != nil {
		t.Fatal(err)
	}
	// Several locks' runs in one request (change 13, what a node's
	// coalescing publisher sends): each run fenced on its own, through
	// daprd's answer per entry.
	errs, err := pub.PublishFencedRuns(ctxT(t), topic, []publish.FencedRun{
		{Lock: "t/g", Events: []*event.Event{out("g", 561)}},
		{Lock: "t/other", Events: []*event.Event{out("stalerun", 0)}},
		{Lock: "t/third", Events: []*event.Event{out("h", 5), out("i", 6)}},
	})
	if err != nil || len(errs) != 3 || errs[0] != nil || !errors.Is(errs[1], publish.ErrFenced) || errs[2] != nil {
		t.Fatalf("runs: %v, %v; want t/other's refused (ErrFenced), the others published", errs, err)
	}
	t.Logf("a stale run among others: %v", errs[1])
	// The stream, in its order: redis-cli XRANGE.
	raw := e.redisCLI(t, "XRANGE", topic, "-", "+")
	if strings.Contains(raw, "fenceLock") {
		t.Fatalf("the fence was stored with the entries:\n%s", raw)
	}
	var got []string
	for _, m := range regexp.MustCompile(`"id":"([a-z]+)"`).FindAllStringSubmatch(raw, -1) {
		got = append(got, m[1])
	}
	if want := "a b c d e f g h i"; strings.Join(got, " ") != want {
		t.Fatalf("the stream holds %v, want %s (the stale output never)", got, want)
	}
	// A request of one fenced output ("stale", "e") goes through daprd's
	// PublishEvent, a longer one through its bulk publish: the broker
	// stores both alike (the same attributes, the same entry metadata).
	// Each entry's fields in any order (an unfenced single publish writes
	// them from a Go map): per entry its data's attribute names and its
	// metadata.
	lines := strings.Split(raw, "\n")
	var shapes []string
	entryID := regexp.MustCompile(`^\d+-\d+$`)
	var data, meta string
	flush := func() {
		if data != "" || meta != "" {
			shapes = append(shapes, data+" | "+meta)
		}
		data, meta = "", ""
	}
	for i, l := range lines {
		l = strings.TrimSpace(l)
		switch {
		case entryID.MatchString(l):
			flush()
		case l == "data" && i+1 < len(lines):
			var attrs map[string]any
			if err := json.Unmarshal([]byte(strings.TrimSpace(lines[i+1])), &attrs); err != nil {
				t.Fatalf("entry data %q: %v", lines[i+1], err)
			}
			data = strings.Join(slices.Sorted(maps.Keys(attrs)), ",")
		case l == "metadata" && i+1 < len(lines):
			meta = strings.TrimSpace(lines[i+1])
		}
	}
	flush()
	if len(shapes) != len(got) {
		t.Fatalf("%d entries read, %d ids:\n%s", len(shapes), len(got), raw)
	}
	for i := 1; i < len(shapes); i++ {
		if shapes[i] != shapes[0] {
			t.Fatalf("stored entries differ: entry %d %q against %q\n%s", i, shapes[i], shapes[0], raw)
		}
	}
}
