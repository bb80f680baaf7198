package redisstate

import (
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"strconv"
	"testing"
	"time"

	"github.com/dapr/components-contrib/metadata"
	"github.com/dapr/components-contrib/state"
	"github.com/dapr/kit/logger"

	"github.com/virtufin/workmanager/deploy/dapr/daprd/internal/redistest"
)

// asString gives what upstream's round trip through %q gives, for strings
// of every byte (binary, invalid UTF-8, quotes, escapes) and for the other
// values a Redis reply may hold.
func TestAsStringIsUpstreamsRoundTrip(t *testing.T) {
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	values := []interface{}{"", "data", "version", "7", string(every), "\xff\xfe invalid", `{"a":"b\"c"}`, "ünïcødé ✓", "\\x41\n\t",
		int64(7), []byte("bytes"), nil, 3.5}
	rnd := rand.New(rand.NewSource(1))
	for range 50 {
		b := make([]byte, rnd.Intn(4096))
		rnd.Read(b)
		values = append(values, string(b))
	}
	for i, v := range values {
		want, _ := strconv.Unquote(fmt.Sprintf("%q", v))
		if got := asString(v); got != want {
			t.Errorf("value %d (%T): asString %q, upstream %q", i, v, got, want)
		}
	}
}

// Binary values of every size read back byte for byte through the store
// on a real Redis: from the hash a Set writes (with its ETag) and from a
// plain key (upstream's fallback for values written before ETags).
func TestBinaryValuesReadBackAsWritten(t *testing.T) {
	addr := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := NewRedisStateStore(logger.NewLogger("test")).(*StateStore)
	if err := s.Init(ctx, state.Metadata{Base: metadata.Base{Properties: map[string]string{"redisHost": addr}}}); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rnd := rand.New(rand.NewSource(2))
	for _, size := range []int{1, 400, 8 << 10, 1 << 20} {
		value := make([]byte, size)
		rnd.Read(value)
		key := fmt.Sprintf("k%d", size)
		if err := s.Set(ctx, &state.SetRequest{Key: key, Value: value}); err != nil {
			t.Fatal(err)
		}
		got, err := s.Get(ctx, &state.GetRequest{Key: key})
		if err != nil || !bytes.Equal(got.Data, value) || got.ETag == nil || *got.ETag != "1" {
			t.Fatalf("%d bytes: read %d bytes (equal %v), ETag %v, %v", size, len(got.Data), bytes.Equal(got.Data, value), got.ETag, err)
		}
		plain := "plain-" + key
		if err := s.client.DoWrite(ctx, "SET", plain, value); err != nil {
			t.Fatal(err)
		}
		got, err = s.Get(ctx, &state.GetRequest{Key: plain})
		if err != nil || !bytes.Equal(got.Data, value) {
			t.Fatalf("%d bytes under a plain key: read %d bytes (equal %v), %v", size, len(got.Data), bytes.Equal(got.Data, value), err)
		}
	}
}
