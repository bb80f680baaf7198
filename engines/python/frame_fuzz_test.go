package python

import (
	"os"
	"testing"

	"github.com/virtufin/workmanager/engines/internal/wire"
)

// fuzzReplyLimit is the reply limit of FuzzReadFrame's reader: small, so
// that frames over it are common.
const fuzzReplyLimit = 4096

// FuzzReadFrame feeds worker-controlled bytes (what a runner writes on its
// reply pipe) to proc.readFrame through a real pipe, frame after frame: it
// must not panic, return a payload over its kind's limit, or allocate for
// a frame more than what arrived (a header announcing 1 GiB costs nothing
// until its bytes come). The corpus is in testdata/fuzz/FuzzReadFrame.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte("\x02\x00\x00\x00R[]"))
	f.Add([]byte("\x05\x00\x00\x00H3.12.\x00\x00\x00\x00O"))
	f.Add([]byte("\xff\xff\xff\x3fRabc"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		wrote := make(chan struct{})
		go func() {
			defer close(wrote)
			w.Write(data) // fails once the reader gave up (EPIPE)
			w.Close()
		}()
		p := &proc{maxReply: fuzzReplyLimit}
		p.RespR = r
		if p.respRC, err = r.SyscallConn(); err != nil {
			t.Fatal(err)
		}
		p.readFn = p.readRaw
		for range 64 {
			kind, payload, err := p.readFrame()
			if err != nil {
				break
			}
			if limit := wire.ChildFrameLimit(kind, fuzzReplyLimit); len(payload) > limit {
				t.Fatalf("frame %q of %d bytes over its limit %d", kind, len(payload), limit)
			}
			if cap(p.rbuf) > 2*(len(data)+initBuf) {
				t.Fatalf("a %d-byte input grew the read buffer to %d bytes", len(data), cap(p.rbuf))
			}
		}
		r.Close()
		<-wrote
	})
}
