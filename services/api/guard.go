package api

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// MaxOtherMessageBytes is the receive limit of every method that carries
// no code (health and reflection too, public or not), enforced by the
// message guard before gRPC reads the message. It leaves room above
// MaxRequestOverhead so that a request a little too large still gets
// MethodSizes' INVALID_ARGUMENT rather than a closed connection.
const MaxOtherMessageBytes = 2 * MaxRequestOverhead

// maxTrackedStreams bounds the streams one connection's guard remembers
// (far above the concurrent streams a connection may have): past it the
// oldest are forgotten, and data on a stream the guard does not know gets
// MaxOtherMessageBytes.
const maxTrackedStreams = 1024

// errMessageTooLarge closes a connection whose client declared a message
// over its method's receive limit.
var errMessageTooLarge = errors.New("api: a message over its method's receive limit; connection closed")

// errCompressed closes a connection whose client sent a compressed message
// to a method with the small limit (its size once inflated is unknown).
var errCompressed = errors.New("api: a compressed message to a method that carries no code; connection closed")

// Credentials wraps inner (TLS; nil: plaintext) with the message guard: on
// every connection, under TLS, it follows the HTTP/2 frames the client
// sends, learns each stream's method from its headers (HPACK), and reads
// the 5-byte prefix of every gRPC message: a message declared larger than
// its method's limit (MaxOtherMessageBytes for every method but the
// code-carrying ones, whose limit is the server's MaxRecvMsgSize) closes
// the connection before gRPC receives it, and so does a compressed
// message to a method with the small limit. gRPC-Go has one receive limit
// per server, checked only once the handler reads (after the tap, before
// any interceptor for unary calls, and not at all per method), so this is
// where a per-method limit can act before the read. It never buffers more
// than a header field.
func (t Transport) Credentials(inner credentials.TransportCredentials) credentials.TransportCredentials {
	if inner == nil {
		inner = insecure.NewCredentials()
	}
	return guardCreds{TransportCredentials: inner, limit: t.limitFor}
}

// limitFor is a method's receive limit.
func (t Transport) limitFor(path string) int {
	if codeMethods[path] && t.MaxRecvBytes > 0 {
		return t.MaxRecvBytes
	}
	return MaxOtherMessageBytes
}

type guardCreds struct {
	credentials.TransportCredentials
	limit func(path string) int
}

func (g guardCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, ai, err := g.TransportCredentials.ServerHandshake(c)
	if err != nil {
		return conn, ai, err
	}
	return &guardConn{Conn: conn, g: newGuard(g.limit)}, ai, nil
}

func (g guardCreds) Clone() credentials.TransportCredentials {
	return guardCreds{TransportCredentials: g.TransportCredentials.Clone(), limit: g.limit}
}

func (g guardCreds) ClientHandshake(ctx context.Context, authority string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return g.TransportCredentials.ClientHandshake(ctx, authority, c)
}

// guardConn runs the guard over what the server reads (gRPC reads a
// connection from one goroutine).
type guardConn struct {
	net.Conn
	g   *guard
	err error
}

func (c *guardConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		if gerr := c.g.feed(p[:n]); gerr != nil {
			c.err = gerr
			c.Conn.Close()
			return 0, gerr
		}
	}
	return n, err
}

// HTTP/2 frame types and flags the guard needs (RFC 9113).
const (
	frameData         = 0x0
	frameHeaders      = 0x1
	frameRSTStream    = 0x3
	frameContinuation = 0x9

	flagEndStream  = 0x1
	flagEndHeaders = 0x4
	flagPadded     = 0x8
	flagPriority   = 0x20

	clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	// hpackTableSize is the server's SETTINGS_HEADER_TABLE_SIZE (gRPC-Go
	// keeps HTTP/2's default): the client's encoder uses at most this.
	hpackTableSize = 4096
)

// guard parses one connection's client-to-server bytes.
type guard struct {
	limit   func(path string) int
	preface int // preface bytes still to skip

	hdr  [9]byte
	hdrN int
	// The frame being read: its type, flags and stream; payload bytes
	// left (padding included), padding at its end, bytes of the pad length
	// and priority fields still to skip.
	inFrame       bool
	typ, flags    byte
	sid           uint32
	left, pad     int
	needPadLen    bool
	prioritySkip  int
	hp            *hpack.Decoder
	path          string
	blockSID      uint32 // the stream of the header block being decoded
	blockEndsStrm bool

	streams map[uint32]*guardStream
}

// guardStream follows the gRPC messages of one stream.
type guardStream struct {
	limit int
	pfx   [5]byte
	pfxN  int
	skip  int // message bytes left to let through
}

func newGuard(limit func(string) int) *guard {
	g := &guard{limit: limit, preface: len(clientPreface), streams: map[uint32]*guardStream{}}
	g.hp = hpack.NewDecoder(hpackTableSize, func(f hpack.HeaderField) {
		if f.Name == ":path" {
			g.path = f.Value
		}
	})
	// A header field larger than the server's header list limit is refused
	// by the server; this only bounds what the guard holds.
	g.hp.SetMaxStringLength(MaxHeaderBytes)
	return g
}

func (g *guard) feed(b []byte) error {
	for len(b) > 0 {
		if g.preface > 0 {
			n := min(g.preface, len(b))
			g.preface -= n
			b = b[n:]
			continue
		}
		if !g.inFrame {
			n := copy(g.hdr[g.hdrN:], b)
			g.hdrN += n
			b = b[n:]
			if g.hdrN < len(g.hdr) {
				continue
			}
			g.hdrN = 0
			g.startFrame()
			if g.left == 0 {
				if err := g.endFrame(); err != nil {
					return err
				}
			}
			continue
		}
		switch {
		case g.needPadLen:
			g.pad = int(b[0])
			g.needPadLen = false
			g.left--
			b = b[1:]
			if g.pad > g.left {
				return fmt.Errorf("api: HTTP/2 frame padding longer than its payload")
			}
		case g.prioritySkip > 0:
			n := min(g.prioritySkip, len(b), g.left)
			g.prioritySkip -= n
			g.left -= n
			b = b[n:]
		case g.left > g.pad:
			n := min(g.left-g.pad, len(b))
			if err := g.body(b[:n]); err != nil {
				return err
			}
			g.left -= n
			b = b[n:]
		default: // padding
			n := min(g.left, len(b))
			g.left -= n
			b = b[n:]
		}
		if g.left == 0 && !g.needPadLen {
			if err := g.endFrame(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (g *guard) startFrame() {
	h := g.hdr
	g.left = int(h[0])<<16 | int(h[1])<<8 | int(h[2])
	g.typ, g.flags = h[3], h[4]
	g.sid = binary.BigEndian.Uint32(h[5:9]) & 0x7fffffff
	g.inFrame, g.pad, g.needPadLen, g.prioritySkip = true, 0, false, 0
	if g.typ == frameData || g.typ == frameHeaders {
		g.needPadLen = g.flags&flagPadded != 0 && g.left > 0
	}
	if g.typ == frameHeaders && g.flags&flagPriority != 0 {
		g.prioritySkip = 5
	}
	if g.typ == frameHeaders {
		g.blockSID, g.blockEndsStrm, g.path = g.sid, g.flags&flagEndStream != 0, ""
	}
}

func (g *guard) body(b []byte) error {
	switch g.typ {
	case frameHeaders, frameContinuation:
		if _, err := g.hp.Write(b); err != nil {
			return fmt.Errorf("api: HPACK: %w", err)
		}
	case frameData:
		s := g.streams[g.sid]
		if s == nil {
			s = g.open(g.sid, MaxOtherMessageBytes)
		}
		return s.data(b)
	}
	return nil
}

func (g *guard) endFrame() error {
	g.inFrame = false
	switch g.typ {
	case frameHeaders, frameContinuation:
		if g.flags&flagEndHeaders == 0 {
			return nil
		}
		if err := g.hp.Close(); err != nil {
			return fmt.Errorf("api: HPACK: %w", err)
		}
		if _, ok := g.streams[g.blockSID]; !ok && !g.blockEndsStrm {
			g.open(g.blockSID, g.limit(g.path))
		}
		if g.blockEndsStrm {
			delete(g.streams, g.blockSID)
		}
	case frameData:
		if g.flags&flagEndStream != 0 {
			delete(g.streams, g.sid)
		}
	case frameRSTStream:
		delete(g.streams, g.sid)
	}
	return nil
}

// open starts following stream sid with a receive limit.
func (g *guard) open(sid uint32, limit int) *guardStream {
	if len(g.streams) >= maxTrackedStreams {
		oldest := sid
		for id := range g.streams {
			oldest = min(oldest, id)
		}
		delete(g.streams, oldest)
	}
	s := &guardStream{limit: limit}
	g.streams[sid] = s
	return s
}

// data follows a stream's bytes: each message is a 5-byte prefix (a flag
// and the length) and the message.
func (s *guardStream) data(b []byte) error {
	for len(b) > 0 {
		if s.skip > 0 {
			n := min(s.skip, len(b))
			s.skip -= n
			b = b[n:]
			continue
		}
		n := copy(s.pfx[s.pfxN:], b)
		s.pfxN += n
		b = b[n:]
		if s.pfxN < len(s.pfx) {
			continue
		}
		s.pfxN = 0
		l := binary.BigEndian.Uint32(s.pfx[1:])
		if s.pfx[0] != 0 && s.limit <= MaxOtherMessageBytes {
			// gzip is registered in this binary: 128 KiB of it would
			// inflate to the server's receive limit.
			return errCompressed
		}
		if int64(l) > int64(s.limit) {
			return fmt.Errorf("%w (%d bytes, limit %d)", errMessageTooLarge, l, s.limit)
		}
		s.skip = int(l)
	}
	return nil
}
