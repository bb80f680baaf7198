package components

import (
	"strings"
	"testing"
)

func TestRenderReplacesValues(t *testing.T) {
	b, err := Render(PubSub, map[string]string{"redisHost": "127.0.0.1:6380", "poolSize": "50"})
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{"- name: redisHost\n    value: \"127.0.0.1:6380\"", "- name: poolSize\n    value: \"50\"", "- name: concurrency\n    value: \"256\""} {
		if !strings.Contains(s, want) {
			t.Errorf("rendered pubsub has no %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "6379") {
		t.Error("default host left in place")
	}
}

func TestRenderRejectsUnknownKey(t *testing.T) {
	if _, err := Render(StateStore, map[string]string{"poolsize": "1"}); err == nil || !strings.Contains(err.Error(), `"poolsize"`) {
		t.Fatalf("got %v", err)
	}
	if _, err := Render("nope.yaml", nil); err == nil {
		t.Fatal("unknown manifest rendered")
	}
}
