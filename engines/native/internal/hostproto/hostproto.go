// Package hostproto is the protocol between the native engine and a
// native-host process (process isolation): the pipes and environment the
// host is started with, and the frames they carry.
package hostproto

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/virtufin/workmanager/engines/internal/wire"
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
//	  'K' load (a spare): the JSON of Load; only to a host started with
//	                      -await, as its first frame
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
	FrameProcess      = 'P'
	FrameGatewayReply = 'G'
	FrameReady        = 'Y'
	FrameLoadError    = 'X'
	FrameResult       = 'R'
	FrameLog          = 'L'
	FrameGatewayCall  = 'C'
	FrameLoad         = 'K'
)

// Load is the payload of a FrameLoad: what a host started with -await
// (a spare, started before its worker was known) loads, and the worker's
// identity, which the host puts in its environment before the library's
// constructors run. Fields as the host's flags.
type Load struct {
	Library    string `json:"library"`
	Entry      string `json:"entry"`
	Free       string `json:"free"`
	ABIVersion int    `json:"abi"`
	WorkerID   string `json:"worker_id"`
	Group      string `json:"group"`
	Topic      string `json:"topic"`
}

// MaxLoadFrame bounds a FrameLoad's payload (the host reads nothing larger).
const MaxLoadFrame = 64 << 10

// The host's pipes.
const (
	RequestFD  = 3 // engine -> host
	ResponseFD = 4 // host -> engine
)

// The worker's identity in the host's environment (exact there: the
// process hosts one worker).
const (
	EnvWorkerID    = "VIRTUFIN_WORKER_ID"
	EnvWorkerGroup = "VIRTUFIN_WORKER_GROUP"
	EnvWorkerTopic = "VIRTUFIN_WORKER_TOPIC"
)

// maxFrame bounds one frame (an event or a response).
const maxFrame = 256 << 20

var errFrameTooLarge = errors.New("frame too large")

// FrameTooLargeError is a frame whose length is over the limit for its
// kind (Reader.Limit); it was not read, and the stream is unusable after
// it.
type FrameTooLargeError struct {
	Kind  byte
	Size  int64
	Limit int
}

func (e *FrameTooLargeError) Error() string {
	return fmt.Sprintf("frame %q of %d bytes exceeds the limit of %d bytes for its kind", e.Kind, e.Size, e.Limit)
}

// Reader reads frames.
type Reader struct {
	r   *bufio.Reader
	buf []byte
	// Limit, when set, bounds the payload (after the kind byte) of a frame
	// of each kind; a longer frame is a *FrameTooLargeError, found before
	// anything is allocated for it. The overall bound (256 MiB) applies
	// always.
	Limit func(kind byte) int
}

// NewReader returns a buffered frame reader.
func NewReader(r io.Reader) *Reader {
	return &Reader{r: bufio.NewReaderSize(r, 64<<10)}
}

// keepBuf: a frame buffer grown past it by one big frame is not kept.
const keepBuf = 1 << 20

// ReadFrame returns the next frame; the payload is valid until the next
// read. Without a Limit, the payload's buffer grows as its bytes arrive (a
// header that announces a big frame costs nothing until they do); with
// one, a frame within its kind's limit is read into one buffer of its
// length.
func (f *Reader) ReadFrame() (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(f.r, hdr[:4]); err != nil {
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if n == 0 {
		return 0, nil, errors.New("empty frame")
	}
	if n > maxFrame {
		return 0, nil, errFrameTooLarge
	}
	if _, err := io.ReadFull(f.r, hdr[4:]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	kind := hdr[4]
	if f.Limit != nil {
		if limit := f.Limit(kind); int64(n-1) > int64(limit) {
			return 0, nil, &FrameTooLargeError{Kind: kind, Size: int64(n - 1), Limit: limit}
		}
	}
	if cap(f.buf) > keepBuf {
		f.buf = nil
	}
	buf := f.buf
	if f.Limit != nil && cap(buf) < int(n-1) {
		// Within its kind's limit: one allocation of the frame's length
		// (a header that lies costs at most the limit), where growing the
		// buffer as the bytes arrive allocates up to three times it.
		buf = make([]byte, 0, n-1)
	}
	b, err := wire.ReadPayload(f.r, buf, int(n-1))
	if err != nil {
		return 0, nil, err
	}
	if cap(b) <= keepBuf {
		f.buf = b
	}
	return kind, b, nil
}

// Writer writes frames.
type Writer struct {
	w *bufio.Writer
}

// NewWriter returns a buffered frame writer.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: bufio.NewWriterSize(w, 64<<10)}
}

// WriteFrame sends one frame made of parts and flushes it.
func (f *Writer) WriteFrame(kind byte, parts ...[]byte) error {
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

// Int32 encodes a payload's int32 field.
func Int32(v int32) []byte {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], uint32(v))
	return b[:]
}

// LenPrefixed encodes a payload's string field (uint32 length, bytes).
func LenPrefixed(s string) []byte {
	b := make([]byte, 4+len(s))
	binary.LittleEndian.PutUint32(b, uint32(len(s)))
	copy(b[4:], s)
	return b
}

// ParseResult decodes an 'R' payload.
func ParseResult(p []byte) (rc int32, hasOut bool, outLen int32, out []byte, err error) {
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

// ParseGatewayCall decodes a 'C' payload.
func ParseGatewayCall(p []byte) (service, method string, req []byte, err error) {
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

// ParseInt32Prefixed decodes an 'L' or 'G' payload: an int32 (level or
// code) and the bytes after it (aliasing p). ok is false when p is short.
func ParseInt32Prefixed(p []byte) (v int32, rest []byte, ok bool) {
	if len(p) < 4 {
		return 0, nil, false
	}
	return int32(binary.LittleEndian.Uint32(p)), p[4:], true
}
