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
	// The stream, in its order: redis-cli XRANGE.
	raw := e.redisCLI(t, "XRANGE", topic, "-", "+")
	if strings.Contains(raw, "fenceLock") {
		t.Fatalf("the fence was stored with the entries:\n%s", raw)
	}
	var got []string
	for _, m := range regexp.MustCompile(`"id":"([a-z]+)"`).FindAllStringSubmatch(raw, -1) {
		got = append(got, m[1])
	}
	if want := "a b c d e f"; strings.Join(got, " ") != want {
		t.Fatalf("the stream holds %v, want %s (the stale output never)", got, want)
	}
	// A request of one fenced output ("stale", "e") goes through daprd's
	// PublishEvent, a longer one through its bulk publish: the broker
	// stores both alike (the same attributes, the same entry metadata).
	lines := strings.Split(raw, "\n")
	var shapes []string
	for i, l := range lines {
		l = strings.TrimSpace(l)
		if l == "data" && i+1 < len(lines) {
			var attrs map[string]any
			if err := json.Unmarshal([]byte(strings.TrimSpace(lines[i+1])), &attrs); err != nil {
				t.Fatalf("entry data %q: %v", lines[i+1], err)
			}
			shapes = append(shapes, strings.Join(slices.Sorted(maps.Keys(attrs)), ","))
		}
		if l == "metadata" && i+1 < len(lines) {
			shapes = append(shapes, strings.TrimSpace(lines[i+1]))
		}
	}
	for i := 2; i < len(shapes); i++ {
		if shapes[i] != shapes[i%2] {
			t.Fatalf("stored entries differ: %q against %q", shapes[i], shapes[i%2])
		}
	}
}
