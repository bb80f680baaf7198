package dotnet

import (
	"bufio"
	"bytes"
	"testing"

	"github.com/virtufin/workmanager/engines/internal/wire"
)

// fuzzReplyLimit is the reply limit of FuzzReadFrame's reader: small, so
// that frames over it are common.
const fuzzReplyLimit = 4096

// FuzzReadFrame feeds worker-controlled bytes (what a host writes on its
// reply pipe) to proc.readFrame, frame after frame: it must not panic,
// return a payload over its kind's limit, or allocate for a frame more
// than what arrived (a header announcing 1 GiB costs nothing until its
// bytes come). The corpus is in testdata/fuzz/FuzzReadFrame.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte("\x02\x00\x00\x00R[]"))
	f.Add([]byte("\x04\x00\x00\x00Hmono\x00\x00\x00\x00O"))
	f.Add([]byte("\xff\xff\xff\x3fRabc"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := &proc{maxReply: fuzzReplyLimit, rd: bufio.NewReaderSize(bytes.NewReader(data), 16<<10)}
		for range 64 {
			kind, payload, err := p.readFrame()
			if err != nil {
				return
			}
			if limit := wire.ChildFrameLimit(kind, fuzzReplyLimit); len(payload) > limit {
				t.Fatalf("frame %q of %d bytes over its limit %d", kind, len(payload), limit)
			}
			if cap(p.rbuf) > 2*len(data)+(4<<10) {
				t.Fatalf("a %d-byte input grew the read buffer to %d bytes", len(data), cap(p.rbuf))
			}
		}
	})
}
