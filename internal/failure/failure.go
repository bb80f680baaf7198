// Package failure declares, once, the application error types that cross the
// Temporal boundary (activity → workflow → API client): an activity or a
// workflow validator returns them as non-retryable application errors, and
// the API maps each to its gRPC code. Everything not listed here is a plain,
// retryable error.
package failure

import (
	"errors"

	"go.temporal.io/sdk/temporal"
)

// Application error types.
const (
	// InvalidArgument: the request itself is wrong (bad code, wrong sha256,
	// unknown MIME type, bad spec). gRPC INVALID_ARGUMENT.
	InvalidArgument = "InvalidArgument"
	// NotFound: the worker does not exist (never created, or deleted).
	// gRPC NOT_FOUND.
	NotFound = "NotFound"
	// AlreadyExists: a create for a worker that exists. gRPC ALREADY_EXISTS.
	AlreadyExists = "AlreadyExists"
	// PermissionDenied: a rule refused the request (a code URL the SSRF
	// rules refuse). gRPC PERMISSION_DENIED.
	PermissionDenied = "PermissionDenied"
)

// New returns a non-retryable application error of type kind.
func New(kind, message string) error {
	return temporal.NewNonRetryableApplicationError(message, kind, nil)
}

// Kind is the application error type in err's chain, or "" when there is
// none.
func Kind(err error) string {
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		return appErr.Type()
	}
	return ""
}

// Message is the message of the application error in err's chain (without
// Temporal's wrapping), or err's text when there is none.
func Message(err error) string {
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		return appErr.Message()
	}
	return err.Error()
}
