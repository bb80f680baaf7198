package wire

import (
	"errors"
	"fmt"
	"io"

	"github.com/virtufin/workmanager/engines"
)

// FrameTooLargeError is a frame from a child whose announced length is over
// the limit for its kind; it was not read (the stream is unusable after
// it). A reply ('R') over the limit is the worker's fault:
// errors.Is(err, engines.ErrReplyTooLarge) holds for every kind.
type FrameTooLargeError struct {
	Kind  byte
	Size  int64
	Limit int
}

func (e *FrameTooLargeError) Error() string {
	return fmt.Sprintf("%s frame %q of %d bytes exceeds the limit of %d bytes (MAX_OUTPUT_BYTES x MAX_OUTPUTS_PER_MESSAGE)",
		frameName(e.Kind), e.Kind, e.Size, e.Limit)
}

func (e *FrameTooLargeError) Unwrap() error { return engines.ErrReplyTooLarge }

func frameName(kind byte) string {
	switch kind {
	case KindResult:
		return "result"
	case KindError:
		return "error report"
	case KindGateway:
		return "gateway call"
	default:
		return "protocol"
	}
}

// smallFrame bounds the frames of a child that carry no worker data (hello,
// ok).
const smallFrame = 64 << 10

// ChildFrameLimit is the largest payload the node reads of a frame of kind
// from a worker child (Python's runner, the .NET host) whose replies are
// bounded by replyLimit (engines.ReplyLimit; <= 0: MaxFrame).
func ChildFrameLimit(kind byte, replyLimit int) int {
	if replyLimit <= 0 || replyLimit > MaxFrame {
		replyLimit = MaxFrame
	}
	switch kind {
	case KindResult, KindError, KindGateway:
		return replyLimit
	default:
		return smallFrame
	}
}

// ReadPayload reads an n-byte payload from r into buf (reused when it is
// big enough). Unless buf is big enough, it never allocates much more than
// twice the bytes that arrived: the buffer doubles as they come, so a
// header that announces a big frame costs little until its bytes really
// come.
// A short read is io.ErrUnexpectedEOF.
func ReadPayload(r io.Reader, buf []byte, n int) ([]byte, error) {
	if n < 0 {
		return nil, errors.New("negative frame length")
	}
	if cap(buf) >= n {
		b := buf[:n]
		if _, err := io.ReadFull(r, b); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		return b, nil
	}
	b := buf[:0]
	for len(b) < n {
		if len(b) == cap(b) {
			grow := min(max(cap(b), 4<<10), n-len(b))
			nb := make([]byte, len(b), len(b)+grow)
			copy(nb, b)
			b = nb
		}
		m, err := r.Read(b[len(b):min(cap(b), n)])
		b = b[:len(b)+m]
		if err != nil {
			if len(b) == n {
				break
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	return b, nil
}
