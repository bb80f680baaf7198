package cli

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Frames of the tracebacks the engines report (DeadLetter.traceback).
var (
	// Python: `  File "<worker>", line 7, in process`; the last is the
	// innermost.
	pythonFrame = regexp.MustCompile(`^\s*File "([^"]*)", line (\d+), in (.+)$`)
	// .NET: `  at Pricer.ProcessAsync (Virtufin.Worker.CloudEvent input)
	// [0x00000] in <hash>:0` (Mono) or `   at Pricer.ProcessAsync(CloudEvent
	// input) in /src/Pricer.cs:line 12` (.NET); the first is the innermost.
	dotnetFrame = regexp.MustCompile(`^\s*at ([^\s(]+)\s*\(.*?\)(?:\s*\[0x[0-9a-fA-F]+\])?(?:\s+in\s+(.+))?\s*$`)
	// A .NET location without a file: Mono's `<hash>:0`.
	noDotnetFile = regexp.MustCompile(`^<[0-9a-f]*>:0$`)
)

// lastFrame is where a traceback says the error happened, in one short
// line: a Python traceback's innermost frame as `file:line in func`, a .NET
// stack's as `Type.Method` (with ` in file:line` when it has one), and
// otherwise (a native worker's error text) its last line. "" for none.
func lastFrame(tb string) string {
	lines := strings.Split(strings.TrimRight(tb, "\n"), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if m := pythonFrame.FindStringSubmatch(lines[i]); m != nil {
			return m[1] + ":" + m[2] + " in " + strings.TrimSpace(m[3])
		}
	}
	for _, l := range lines {
		if m := dotnetFrame.FindStringSubmatch(l); m != nil {
			where := strings.TrimSpace(m[2])
			if where == "" || noDotnetFile.MatchString(where) {
				return m[1]
			}
			return m[1] + " in " + strings.Replace(where, ":line ", ":", 1)
		}
	}
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" {
			return l
		}
	}
	return ""
}

// statsRows are the rows `get` shows for a worker's message counts.
func statsRows(s *pb.WorkerStats) [][2]string {
	if s == nil {
		return [][2]string{{"Messages", "no node has reported any yet"}}
	}
	last, at := "-", "-"
	if s.GetLastError() != "" {
		last = short(s.GetLastError(), 200)
		at = ts(s.GetLastErrorAt())
		if id := s.GetLastErrorEventId(); id != "" {
			at += " (event " + short(id, 80) + ")"
		}
	}
	return [][2]string{
		{"Processed", strconv.FormatInt(s.GetProcessed(), 10)},
		{"Failed attempts", strconv.FormatInt(s.GetFailed(), 10)},
		{"Dead-lettered", strconv.FormatInt(s.GetDeadLettered(), 10)},
		{"Last error", last},
		{"Last error at", at},
	}
}

// deadLetterKey tells stored dead letters apart: one per worker, event
// (source and id) and time it was given up on (a replayed one that fails
// again is new).
func deadLetterKey(d *pb.DeadLetter) string {
	return d.GetSource() + "\x00" + d.GetEventId() + "\x00" + strconv.FormatInt(d.GetAt().AsTime().UnixNano(), 10)
}

// Polling of dead-letters --wait.
const (
	waitPollFirst = 250 * time.Millisecond
	waitPollMax   = 5 * time.Second
	// waitGrace: a dead letter given up on this long before the command
	// started still counts as new, so that `publish` then `dead-letters
	// --wait` shows a failure that was dead-lettered at once (an output
	// refused, a worker with one attempt) instead of waiting past it.
	waitGrace = 10 * time.Second
)

// waitDeadLetters lists req's dead letters until one appears that was not
// there at the start, or was given up on at most waitGrace before it
// (polling, backing off from waitPollFirst to waitPollMax), within
// --timeout, and returns the new ones. It lists up to
// maxListLimit: a worker with more stored than that shows its new ones
// only as older ones are replayed or expire.
func (a *app) waitDeadLetters(ctx context.Context, req *pb.ListDeadLettersRequest) ([]*pb.DeadLetter, error) {
	c, err := a.api()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	stop := startSpinner(a.io.Err, a.io.ErrIsTerminal, "waiting for a new dead letter of "+req.GetWorkerId())
	defer stop()
	list := &pb.ListDeadLettersRequest{WorkerId: req.GetWorkerId(), Reason: req.GetReason(), Limit: maxListLimit}
	since := time.Now().Add(-waitGrace)
	resp, err := c.ListDeadLetters(ctx, list)
	if err != nil {
		return nil, &remoteError{what: "the API at " + a.cfg.Addr, timeout: a.cfg.Timeout, err: err}
	}
	seen := map[string]bool{}
	var recent []*pb.DeadLetter
	for _, d := range resp.GetDeadLetters() {
		if d.GetAt().AsTime().Before(since) {
			seen[deadLetterKey(d)] = true
		} else {
			recent = append(recent, d)
		}
	}
	if len(recent) > 0 {
		return recent, nil
	}
	wait := waitPollFirst
	for {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, &localError{code: ExitUnavailable, err: fmt.Errorf("no new dead letter of %s within --timeout %s", req.GetWorkerId(), a.cfg.Timeout)}
			}
			return nil, ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, waitPollMax)
		resp, err := c.ListDeadLetters(ctx, list)
		if err != nil {
			if ctx.Err() != nil {
				continue // the deadline, reported above
			}
			return nil, &remoteError{what: "the API at " + a.cfg.Addr, timeout: a.cfg.Timeout, err: err}
		}
		var fresh []*pb.DeadLetter
		for _, d := range resp.GetDeadLetters() {
			if !seen[deadLetterKey(d)] {
				fresh = append(fresh, d)
			}
		}
		if len(fresh) > 0 {
			return fresh, nil
		}
	}
}

// maxListLimit is the API's largest ListDeadLetters page.
const maxListLimit = 1000
