package state_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

// The hold hook (WM_TEST_STATE_HOLD_FILE) holds a Put to a listed key
// until the file no longer lists it, says so in <file>.held, lets the Put
// go ahead even if its context ended meanwhile, and reports the store's
// answer in <file>.done; other keys pass.
func TestHoldFileHoldsAListedKeyUntilReleased(t *testing.T) {
	hold := filepath.Join(t.TempDir(), "hold")
	if err := os.WriteFile(hold, []byte("k/held\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	st := state.WithHoldFile(state.NewMemoryStore(), hold)
	if err := st.Put(context.Background(), "k/held/history", []byte("x"), state.PutOptions{}); err != nil {
		t.Fatalf("a key not listed: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- st.Put(ctx, "k/held", []byte("v"), state.PutOptions{}) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(hold + ".held")
		if err == nil && strings.TrimSpace(string(b)) == strconv.Itoa(os.Getpid()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no .held marker")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("the held Put returned while held: %v", err)
	default:
	}
	cancel() // the activity was given up meanwhile
	if err := os.WriteFile(hold, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the released Put: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the released Put did not go ahead")
	}
	if it, err := st.Get(context.Background(), "k/held"); err != nil || string(it.Value) != "v" {
		t.Fatalf("the held write: %q %v", it.Value, err)
	}
	if b, err := os.ReadFile(hold + ".done"); err != nil || string(b) != "k/held\n<nil>\n" {
		t.Fatalf(".done: %q %v", b, err)
	}
}
