package cli

import (
	"context"
	"errors"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Exit codes, for scripts (cmd/wmctl/README.md).
const (
	ExitOK          = 0
	ExitError       = 1 // anything else
	ExitUsage       = 2 // bad flags, arguments or configuration
	ExitNotFound    = 3 // NOT_FOUND
	ExitAuth        = 4 // UNAUTHENTICATED, PERMISSION_DENIED
	ExitInvalid     = 5 // INVALID_ARGUMENT, FAILED_PRECONDITION, ALREADY_EXISTS, OUT_OF_RANGE
	ExitUnavailable = 6 // UNAVAILABLE, DEADLINE_EXCEEDED: the server is not reachable or did not answer in time
)

// codeExits is the one place gRPC status codes become exit codes; a code
// not listed is ExitError.
var codeExits = map[codes.Code]int{
	codes.OK:                 ExitOK,
	codes.NotFound:           ExitNotFound,
	codes.Unauthenticated:    ExitAuth,
	codes.PermissionDenied:   ExitAuth,
	codes.InvalidArgument:    ExitInvalid,
	codes.FailedPrecondition: ExitInvalid,
	codes.AlreadyExists:      ExitInvalid,
	codes.OutOfRange:         ExitInvalid,
	codes.Unavailable:        ExitUnavailable,
	codes.DeadlineExceeded:   ExitUnavailable,
}

// ExitCodeOf is the exit code for a gRPC status code.
func ExitCodeOf(c codes.Code) int {
	if e, ok := codeExits[c]; ok {
		return e
	}
	return ExitError
}

// codeURLRefused starts the message of a code URL the server's policy
// refuses (PERMISSION_DENIED, docs/security.md): a rejected request, exit
// 5, not a problem with the caller's credentials or role.
const codeURLRefused = "code.url refused by rule "

// ExitCode is the exit code for an error a command returned.
func ExitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	if isUsage(err) {
		return ExitUsage
	}
	var le *localError
	if errors.As(err, &le) {
		return le.code
	}
	if s, ok := grpcStatus(err); ok {
		if s.Code() == codes.PermissionDenied && strings.HasPrefix(s.Message(), codeURLRefused) {
			return ExitInvalid // the server's code URL policy refused the request, not the caller
		}
		return ExitCodeOf(s.Code())
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return ExitUnavailable
	}
	return ExitError
}

// Message is what wmctl prints for err: a gRPC status's own message (not
// the chain of Go errors around it), with what was not reachable for
// UNAVAILABLE and DEADLINE_EXCEEDED.
func Message(err error) string {
	var re *remoteError
	s, isStatus := grpcStatus(err)
	if !isStatus {
		return err.Error()
	}
	msg := s.Message()
	if errors.As(err, &re) {
		switch s.Code() {
		case codes.Unavailable:
			return re.what + " is not reachable: " + msg
		case codes.DeadlineExceeded:
			if re.timeout > 0 {
				return re.what + " did not answer within " + re.timeout.String() + " (--timeout)"
			}
			return re.what + " did not answer in time: " + msg
		}
	}
	if msg == "" {
		msg = s.Code().String()
	}
	return msg
}

// grpcStatus finds a gRPC status in err's chain.
func grpcStatus(err error) (*status.Status, bool) {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.GRPCStatus(), true
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return status.New(codes.DeadlineExceeded, err.Error()), true
	}
	return nil, false
}

// remoteError is a failed call to a server, named for the message.
type remoteError struct {
	what    string // "the API at 127.0.0.1:50051"
	timeout time.Duration
	err     error
}

func (e *remoteError) Error() string { return e.what + ": " + e.err.Error() }
func (e *remoteError) Unwrap() error { return e.err }

// usageError is a problem with the command line (or configuration).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usageErr(err error) error { return &usageError{err} }

func isUsage(err error) bool {
	var u *usageError
	return errors.As(err, &u)
}
