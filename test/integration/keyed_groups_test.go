package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/infraevents"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// keyedCall is one call of keyedWorker, from its own log.
type keyedCall struct {
	ID    string `json:"id"`
	Key   string `json:"key"`
	Enter int64  `json:"enter"`
	Exit  int64  `json:"exit"`
	Tok   string `json:"tok"`
	Node  string `json:"node"`
}

// keyedWorker logs each call's subject, enter and exit times and fencing
// token, waiting sleepMs inside the call.
func keyedWorker(logPath, outTopic string, sleepMs int) []byte {
	return []byte(fmt.Sprintf(`
import json, os, time

def process(event):
    enter = time.time_ns()
    time.sleep(%[3]d / 1000.0)
    line = json.dumps({"id": event["id"], "key": event.get("subject") or "", "enter": enter, "exit": time.time_ns(),
                       "tok": event.get("fencingtoken"), "node": os.environ.get("WORKMANAGER_NODE_ID")})
    with open(%[1]q, "a") as f:
        f.write(line + "\n")
    return {"type": %[2]q, "data": {"id": event["id"]}}
`, logPath, outTopic, sleepMs))
}

// Issue 47 item 2 on the real stack: a keyed group (group_key "subject")
// on two nodes. By the worker's own enter/exit times and tokens: no two
// executions of one key overlap anywhere, each key's tokens grow in the
// order its executions ran, and executions of different keys do overlap.
// GetWorker names the key, and the lock events carry it.
func TestKeyedGroupAcrossNodes(t *testing.T) {
	inTurn(t) // a stack of its own, two nodes
	e := newEnvWith(t, envConfig{nodeEnv: []string{"NODE_HEARTBEAT=5s"}, processingTimeout: time.Minute})
	e.startNodeB(t)
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := collectFrom(e.subscribe(out))
	locks := collectFrom(e.subscribe(infraevents.GroupLockTopic))
	logPath := filepath.Join(workerDir(t), "keyed.log")
	group := "k-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	id := e.createWith(t, &pb.CreateWorkerRequest{Code: pyCode(keyedWorker(logPath, out, 20)), Topic: in, Group: group, GroupKey: "subject"})
	w, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: id})
	if err != nil || w.GetGroupKey() != "subject" {
		t.Fatalf("GetWorker: group key %q, %v", w.GetGroupKey(), err)
	}
	const keys, each = 8, 12
	for i := range keys * each {
		e.publishEvent(in, map[string]any{"id": "m" + strconv.Itoa(i), "type": "test.input", "subject": "order-" + strconv.Itoa(i%keys),
			"datacontenttype": "application/json", "data": map[string]any{"n": i}})
	}
	waitFor(t, 3*time.Minute, fmt.Sprintf("%d outputs", keys*each), func() bool { return outs.distinct() >= keys*each })

	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	var cs []keyedCall
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var c keyedCall
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		cs = append(cs, c)
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].Enter < cs[j].Enter })
	byKey := map[string][]keyedCall{}
	nodes := map[string]int{}
	for _, c := range cs {
		if c.Key == "" || c.Tok == "" {
			t.Fatalf("call %+v without its key or token", c)
		}
		byKey[c.Key] = append(byKey[c.Key], c)
		nodes[c.Node]++
	}
	if len(byKey) != keys {
		t.Fatalf("%d keys in the log, want %d", len(byKey), keys)
	}
	for key, kc := range byKey {
		for i := 1; i < len(kc); i++ {
			if kc[i].Enter < kc[i-1].Exit {
				t.Fatalf("key %s: %s (node %q) entered before %s (node %q) left", key, kc[i].ID, kc[i].Node, kc[i-1].ID, kc[i-1].Node)
			}
			prev, _ := strconv.ParseInt(kc[i-1].Tok, 10, 64)
			tok, _ := strconv.ParseInt(kc[i].Tok, 10, 64)
			if tok <= prev {
				t.Fatalf("key %s: token %d on %s after %d on %s", key, tok, kc[i].ID, prev, kc[i-1].ID)
			}
		}
	}
	// Different keys ran at the same time (the point of keys).
	parallel := 0
	for i := 1; i < len(cs); i++ {
		if cs[i].Enter < cs[i-1].Exit && cs[i].Key != cs[i-1].Key {
			parallel++
		}
	}
	if parallel == 0 {
		t.Fatal("no two executions of different keys overlapped")
	}
	t.Logf("%d calls of %d keys on nodes %v; %d overlapping pairs of different keys, none of one key", len(cs), keys, nodes, parallel)
	waitFor(t, 30*time.Second, "a lock event naming its key", func() bool {
		for _, ev := range locks.all() {
			var d struct{ Group, Key string }
			if json.Unmarshal(ev.Data(), &d) == nil && strings.HasSuffix(d.Group, group) && strings.HasPrefix(d.Key, "order-") {
				return true
			}
		}
		return false
	})
}
