package api

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2client writes what an HTTP/2 client sends, with the frame features
// gRPC clients seldom use: padding, priorities, header blocks split into
// HEADERS and CONTINUATION, and an HPACK dynamic table kept across calls.
type h2client struct {
	out bytes.Buffer
	fr  *http2.Framer
	hb  bytes.Buffer
	enc *hpack.Encoder
}

func newH2Client() *h2client {
	c := &h2client{}
	c.out.WriteString(clientPreface)
	c.fr = http2.NewFramer(&c.out, nil)
	c.enc = hpack.NewEncoder(&c.hb)
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
	return c
}

// call opens stream sid on path and sends messages of the given lengths
// in padded DATA frames of at most 1,000 bytes.
func (c *h2client) call(t *testing.T, sid uint32, path string, msgs ...int) {
	t.Helper()
	c.hb.Reset()
	for _, f := range []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: path}, {Name: "content-type", Value: "application/grpc"},
		{Name: "x-filler", Value: strings.Repeat("f", 300)}} {
		if err := c.enc.WriteField(f); err != nil {
			t.Fatal(err)
		}
	}
	block := c.hb.Bytes()
	half := len(block) / 2
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid, BlockFragment: block[:half], PadLength: 7,
		Priority: http2.PriorityParam{StreamDep: 0, Weight: 15}}); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteContinuation(sid, true, block[half:]); err != nil {
		t.Fatal(err)
	}
	var data []byte
	for _, n := range msgs {
		var pfx [5]byte
		binary.BigEndian.PutUint32(pfx[1:], uint32(n))
		data = append(data, pfx[:]...)
		data = append(data, bytes.Repeat([]byte{'m'}, n)...)
	}
	for len(data) > 0 {
		n := min(1000, len(data))
		if err := c.fr.WriteDataPadded(sid, n == len(data), data[:n], []byte{0, 0, 0}); err != nil {
			t.Fatal(err)
		}
		data = data[n:]
	}
	c.fr.WriteRSTStream(sid+1000, http2.ErrCodeCancel) // a frame of another kind
}

// compressedCall is call with one compressed message of n bytes.
func (c *h2client) compressedCall(t *testing.T, sid uint32, path string, n int) {
	t.Helper()
	c.call(t, sid, path, n)
	b := c.out.Bytes()
	i := bytes.LastIndex(b, append([]byte{0}, binary.BigEndian.AppendUint32(nil, uint32(n))...))
	if i < 0 {
		t.Fatal("no prefix")
	}
	b[i] = 1 // the compressed flag
}

// feedIn feeds b to a guard in chunks of n bytes.
func feedIn(g *guard, b []byte, n int) error {
	for len(b) > 0 {
		k := min(n, len(b))
		if err := g.feed(b[:k]); err != nil {
			return err
		}
		b = b[k:]
	}
	return nil
}

// TestGuardParsesFramesSplitAnywhere: the guard follows a connection read
// in pieces of any size (down to one byte): many calls within their
// limits pass, a code-carrying call may be large (and compressed), and one
// message over its method's limit, or compressed to a method that carries
// no code, is found, wherever the reads split it.
func TestGuardParsesFramesSplitAnywhere(t *testing.T) {
	tr := Transport{MaxRecvBytes: 1 << 20}
	const get, create = "/workmanager.v1.WorkManagerService/GetWorker", "/workmanager.v1.WorkManagerService/CreateWorker"
	good := newH2Client()
	for i := range 20 {
		good.call(t, uint32(2*i+1), get, 10, MaxOtherMessageBytes, 0)
	}
	good.call(t, 41, create, 900<<10)
	good.call(t, 43, "/grpc.health.v1.Health/Check", 3)
	bad := newH2Client()
	bad.call(t, 1, get, 10)
	bad.call(t, 3, create, 900<<10)
	bad.call(t, 5, "/grpc.health.v1.Health/Check", 3, MaxOtherMessageBytes+1)
	good.compressedCall(t, 45, create, 100)
	squeezed := newH2Client()
	squeezed.call(t, 1, get, 10)
	squeezed.compressedCall(t, 3, "/grpc.health.v1.Health/Check", 100)
	for _, n := range []int{1, 2, 3, 5, 9, 13, 1000, 4096, 1 << 20} {
		g := newGuard(tr.limitFor)
		if err := feedIn(g, good.out.Bytes(), n); err != nil {
			t.Fatalf("reads of %d: good calls refused: %v", n, err)
		}
		if len(g.streams) != 0 {
			t.Fatalf("reads of %d: %d streams left after they ended", n, len(g.streams))
		}
		if err := feedIn(newGuard(tr.limitFor), bad.out.Bytes(), n); !errors.Is(err, errMessageTooLarge) {
			t.Fatalf("reads of %d: a message over the limit: %v", n, err)
		}
		if err := feedIn(newGuard(tr.limitFor), squeezed.out.Bytes(), n); !errors.Is(err, errCompressed) {
			t.Fatalf("reads of %d: a compressed health check: %v", n, err)
		}
	}
}
