package engines

import (
	"errors"
	"fmt"
)

// ErrReplyTooLarge is wrapped (with ErrWorkerFailed) by a call whose reply
// is larger than the engine's reply limit (MaxReplyBytes in each engine's
// Config), or whose decoding would take more than it. The engines enforce
// it while they read a reply, before they allocate for it, and before
// they decode it (wire.DecodeOutputs, the native engine's verifier charge
// each output's attributes and extensions), so a worker cannot make the
// node's heap grow by more than ReplyMemoryMultiple times the limit for
// one call.
var ErrReplyTooLarge = errors.New("the reply is larger than the node's output limit")

// ReplyMemoryMultiple bounds what one reply may cost the node's heap, as a
// multiple of the reply limit: the frame (read as its bytes arrive, at most
// twice the limit allocated) and its decoding (at most the limit).
// docs/security.md states it; the engines' TestReplyDecodingIsBounded
// measure it.
const ReplyMemoryMultiple = 3

// Reply limit parts: what a reply may add to the outputs' data.
const (
	// ReplyOutputOverhead is allowed per output for its attributes,
	// extensions and encoding.
	ReplyOutputOverhead = 16 << 10
	// ReplyOverhead is allowed per reply (framing, an error report).
	ReplyOverhead = 64 << 10
	// MaxReplyLimit caps every reply limit (the wire protocols' frame
	// bound).
	MaxReplyLimit = 1 << 30
)

// DefaultMaxReplyBytes is the reply limit of an engine whose Config sets
// none: ReplyLimit of the dispatcher's defaults (100 outputs of 1 MiB).
const DefaultMaxReplyBytes = 100*((1<<20)*4/3+ReplyOutputOverhead) + ReplyOverhead

// ReplyLimit is the most bytes an engine reads (and decodes) of one call's
// reply when the node accepts at most maxOutputs outputs with
// maxOutputBytes of data each (MAX_OUTPUTS_PER_MESSAGE, MAX_OUTPUT_BYTES):
// every reply the node would accept fits (data as base64 costs 4/3 of its
// size), anything much larger is refused while it is read. It is capped
// at MaxReplyLimit.
func ReplyLimit(maxOutputs, maxOutputBytes int) int {
	if maxOutputs <= 0 || maxOutputBytes <= 0 {
		return DefaultMaxReplyBytes
	}
	per := int64(maxOutputBytes)*4/3 + ReplyOutputOverhead
	n := int64(maxOutputs)*per + ReplyOverhead
	if n > MaxReplyLimit {
		return MaxReplyLimit
	}
	return int(n)
}

// ReplyTooLarge is the error of a call whose reply (what) of n bytes is
// over limit; n < 0 when the size is not known yet.
func ReplyTooLarge(what string, n int64, limit int) error {
	if n < 0 {
		return fmt.Errorf("%w: %w: %s exceeds the limit of %d bytes (MAX_OUTPUT_BYTES x MAX_OUTPUTS_PER_MESSAGE)", ErrWorkerFailed, ErrReplyTooLarge, what, limit)
	}
	return fmt.Errorf("%w: %w: %s of %d bytes exceeds the limit of %d bytes (MAX_OUTPUT_BYTES x MAX_OUTPUTS_PER_MESSAGE)", ErrWorkerFailed, ErrReplyTooLarge, what, n, limit)
}
