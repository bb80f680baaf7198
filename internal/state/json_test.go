package state_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/virtufin/workmanager/internal/state"
)

// UpdateJSON loses no change when writers race (ETag retry), and GetJSON
// reads what they wrote.
func TestUpdateJSONUnderContention(t *testing.T) {
	ctx := context.Background()
	s := state.NewMemoryStore()
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := state.UpdateJSON(ctx, s, "k", func(m *map[string]int) bool {
				if *m == nil {
					*m = map[string]int{}
				}
				(*m)[strconv.Itoa(i)] = i
				return true
			}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	m, etag, err := state.GetJSON[map[string]int](ctx, s, "k")
	if err != nil || etag == "" || len(m) != 20 {
		t.Fatalf("after 20 racing updates: %v %q %v", m, etag, err)
	}
	if err := state.UpdateJSON(ctx, s, "k", func(*map[string]int) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if _, etag2, _ := state.GetJSON[map[string]int](ctx, s, "k"); etag2 != etag {
		t.Fatal("change returning false must not write")
	}
	if err := s.Put(ctx, "bad", []byte("{"), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := state.GetJSON[map[string]int](ctx, s, "bad"); err == nil || !strings.Contains(err.Error(), "decode bad") {
		t.Fatalf("corrupt value: %v", err)
	}
}
