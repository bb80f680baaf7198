package native

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The native-host protocol (process isolation).
//
// The engine starts the host (cmd/native-host) with two extra pipes: fd 3
// carries frames from the engine to the host, fd 4 frames from the host to
// the engine. The host's stdout and stderr go to the worker's log. A frame
// is a little-endian uint32 length n, then n bytes: one kind byte and the
// payload. The event and the response are the very FlatBuffers buffers of
// the in-process ABI.
//
//	engine -> host
//	  'P' process:        CloudEvent buffer
//	  'G' gateway reply:  int32 code, response bytes
//	host -> engine
//	  'Y' ready:          (empty) the library is loaded
//	  'X' load failed:    uint8 invalid (1: bad code), message
//	  'R' result:         int32 rc, uint8 has_out, int32 out_len, out bytes
//	  'L' log:            int32 level, message
//	  'C' gateway call:   uint32 len, service, uint32 len, method, request
//
// One host process serves one call at a time: after a 'P' the engine reads
// frames until the 'R', answering every 'C' with a 'G'.
const (
	frameProcess      = 'P'
	frameGatewayReply = 'G'
	frameReady        = 'Y'
	frameLoadError    = 'X'
	frameResult       = 'R'
	frameLog          = 'L'
	frameGateway      = 'C'
)

// maxFrame bounds one frame (an event or a response).
const maxFrame = 256 << 20

var errFrameTooLarge = errors.New("frame too large")

type frameReader struct {
	r   *bufio.Reader
	buf []byte
}

func newFrameReader(r io.Reader) *frameReader {
	return &frameReader{r: bufio.NewReaderSize(r, 64<<10)}
}

// read returns the next frame; the payload is valid until the next read.
func (f *frameReader) read() (byte, []byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(f.r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if n == 0 {
		return 0, nil, errors.New("empty frame")
	}
	if n > maxFrame {
		return 0, nil, errFrameTooLarge
	}
	if cap(f.buf) < int(n) {
		f.buf = make([]byte, n)
	}
	b := f.buf[:n]
	if _, err := io.ReadFull(f.r, b); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return b[0], b[1:], nil
}

type frameWriter struct {
	w *bufio.Writer
}

func newFrameWriter(w io.Writer) *frameWriter {
	return &frameWriter{w: bufio.NewWriterSize(w, 64<<10)}
}

// write sends one frame made of parts and flushes it.
func (f *frameWriter) write(kind byte, parts ...[]byte) error {
	n := 1
	for _, p := range parts {
		n += len(p)
	}
	if n > maxFrame {
		return errFrameTooLarge
	}
	var hdr [5]byte
	binary.LittleEndian.PutUint32(hdr[:4], uint32(n))
	hdr[4] = kind
	f.w.Write(hdr[:])
	for _, p := range parts {
		f.w.Write(p)
	}
	return f.w.Flush()
}

func le32(v int32) []byte {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], uint32(v))
	return b[:]
}

// parseResult decodes an 'R' payload.
func parseResult(p []byte) (rc int32, hasOut bool, outLen int32, out []byte, err error) {
	if len(p) < 9 {
		return 0, false, 0, nil, fmt.Errorf("short result frame (%d bytes)", len(p))
	}
	rc = int32(binary.LittleEndian.Uint32(p))
	hasOut = p[4] != 0
	outLen = int32(binary.LittleEndian.Uint32(p[5:]))
	out = p[9:]
	if hasOut && outLen > 0 && int(outLen) != len(out) {
		return 0, false, 0, nil, fmt.Errorf("result frame: %d response bytes, header says %d", len(out), outLen)
	}
	return rc, hasOut, outLen, out, nil
}

// parseGatewayCall decodes a 'C' payload.
func parseGatewayCall(p []byte) (service, method string, req []byte, err error) {
	next := func() (string, bool) {
		if len(p) < 4 {
			return "", false
		}
		n := binary.LittleEndian.Uint32(p)
		if uint64(n) > uint64(len(p)-4) {
			return "", false
		}
		s := string(p[4 : 4+n])
		p = p[4+n:]
		return s, true
	}
	var ok1, ok2 bool
	service, ok1 = next()
	method, ok2 = next()
	if !ok1 || !ok2 {
		return "", "", nil, errors.New("malformed gateway call frame")
	}
	return service, method, p, nil
}

func lenPrefixed(s string) []byte {
	b := make([]byte, 4+len(s))
	binary.LittleEndian.PutUint32(b, uint32(len(s)))
	copy(b[4:], s)
	return b
}
