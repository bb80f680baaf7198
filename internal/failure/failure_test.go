package failure

import (
	"errors"
	"fmt"
	"testing"

	"go.temporal.io/sdk/temporal"
)

func TestKindSurvivesWrapping(t *testing.T) {
	err := fmt.Errorf("update failed: %w", New(NotFound, "worker w is deleted"))
	if Kind(err) != NotFound || Message(err) != "worker w is deleted" {
		t.Fatalf("kind %q message %q", Kind(err), Message(err))
	}
	var appErr *temporal.ApplicationError
	if !errors.As(err, &appErr) || !appErr.NonRetryable() {
		t.Fatal("not a non-retryable application error")
	}
	if Kind(errors.New("plain")) != "" || Message(errors.New("plain")) != "plain" {
		t.Fatal("a plain error has no kind")
	}
}
