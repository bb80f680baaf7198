package engines

import (
	"errors"
	"strings"
	"testing"
)

func TestReplyLimit(t *testing.T) {
	if got := ReplyLimit(100, 1<<20); got != DefaultMaxReplyBytes {
		t.Errorf("ReplyLimit of the defaults = %d, want DefaultMaxReplyBytes %d", got, DefaultMaxReplyBytes)
	}
	// Every reply the dispatcher accepts fits: maxOutputs outputs with
	// maxOutputBytes of data each, as base64.
	if got, min := ReplyLimit(10, 3000), 10*4000; got < min {
		t.Errorf("ReplyLimit(10, 3000) = %d, below %d", got, min)
	}
	if got := ReplyLimit(10000, 64<<20); got != MaxReplyLimit {
		t.Errorf("ReplyLimit is not capped: %d", got)
	}
	if got := ReplyLimit(0, 0); got != DefaultMaxReplyBytes {
		t.Errorf("ReplyLimit(0, 0) = %d", got)
	}
	err := ReplyTooLarge("the reply", 5000, 1000)
	if !errors.Is(err, ErrReplyTooLarge) || !errors.Is(err, ErrWorkerFailed) || !strings.Contains(err.Error(), "of 5000 bytes exceeds the limit of 1000 bytes") {
		t.Errorf("ReplyTooLarge = %v", err)
	}
}
