package dispatch

// Stage 4 of a message, for one worker: the call. The worker's engine
// instance processes the input (with the fencing token, for a grouped
// worker); its outputs go to outputs.go, a failure, classified, to
// settle.go.

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/deadletter"
)

// call runs w's engine on in (j's message as w sees it).
func (d *Dispatcher) call(ctx context.Context, w *worker, j *job, in *event.Event) {
	if d.cfg.PanicOn != "" {
		if _, ok := j.m.ec.Extensions[d.cfg.PanicOn]; ok {
			panic("injected by the " + d.cfg.PanicOn + " test hook")
		}
	}
	if w.giveBack {
		ctx = engines.WithGiveBack(ctx, w.stopped)
	}
	outs, loan, err := w.process(ctx, in)
	w.m.Processing.Observe(time.Since(j.started).Seconds())
	var answer *engines.ErrorAnswer
	if errors.As(err, &answer) {
		// The worker's own error answer: its error response (or a
		// default one) is published like any output, and the event is
		// done (settle.go announces it).
		j.r.answered = answer
		outs, err = answer.Outputs, nil
		if len(outs) == 0 {
			outs = []event.Event{errorResponse(j.m, answer.Message)}
		}
	}
	if err != nil {
		giveBack(loan)
		d.fail(j.r, err)
		d.finish(w, j)
		return
	}
	if j.r.answered == nil {
		if msg, ok := devKitErrorResponse(j.m, outs); ok {
			// Announced like an error answer (settle.go); published as it is.
			j.r.answered = &engines.ErrorAnswer{Message: msg}
		}
	}
	d.publishAll(ctx, w, j, outs)
	if loan != nil {
		// Published (or refused): the worker's memory is no longer read.
		if j.r.answered != nil {
			j.r.answered.Outputs = nil
		}
		loan.Return()
	}
	d.finish(w, j)
}

// giveBack returns a loan, if any.
func giveBack(l engines.Loan) {
	if l != nil {
		l.Return()
	}
}

// devKitErrorResponse finds, among outs, an error response the DevKits'
// Error/error helpers build for m (Python, .NET): type "….error", data
// exactly {"error": message, "input_id": m's id, "input_type": m's type}.
// Such an answer is the worker's error answer as the native ABI's
// error_message is: announced as a worker.error (error_type
// "error_response").
func devKitErrorResponse(m *message, outs []event.Event) (string, bool) {
	for i := range outs {
		o := &outs[i]
		if !strings.HasSuffix(o.Type(), ErrorSuffix) || len(o.DataEncoded) == 0 || len(o.DataEncoded) > 64<<10 || o.DataEncoded[0] != '{' {
			continue
		}
		var d map[string]any
		if json.Unmarshal(o.DataEncoded, &d) != nil || len(d) != 3 {
			continue
		}
		msg, ok1 := d["error"].(string)
		id, ok2 := d["input_id"].(string)
		typ, ok3 := d["input_type"].(string)
		if ok1 && ok2 && ok3 && id == m.ev.ID() && typ == m.ev.Type() {
			return msg, true
		}
	}
	return "", false
}

// process calls w's current instance; a hot reload between two calls
// swaps it, and a call in flight finishes on the instance it started on.
// Outputs an instance lends (engines.Lender) come with their loan, which
// the caller returns once they are published: the instance does not
// finish closing before.
func (w *worker) process(ctx context.Context, in *event.Event) ([]event.Event, engines.Loan, error) {
	for {
		ref := w.inst.Load()
		ref.mu.RLock()
		if ref.closed {
			ref.mu.RUnlock()
			if w.inst.Load() == ref {
				return nil, nil, engines.ErrClosed
			}
			continue // swapped by a hot reload: use the new instance
		}
		var outs []event.Event
		var loan engines.Loan
		var err error
		if ref.lender != nil {
			outs, loan, err = ref.lender.ProcessLent(ctx, in)
		} else {
			outs, err = ref.Process(ctx, in)
		}
		ref.mu.RUnlock()
		return outs, loan, err
	}
}

// fail classifies an engine error.
func (d *Dispatcher) fail(r *result, err error) {
	r.outcome, r.err = outcomeFailed, err
	switch {
	case errors.Is(err, engines.ErrClosed) || errors.Is(err, engines.ErrGivenBack) || d.ctx.Err() != nil:
		// Stopped or reloaded mid-call, or given back before it started:
		// not the worker's fault.
		r.outcome = outcomeCut
	case errors.Is(err, engines.ErrTimeout):
		r.reason = deadletter.ReasonTimeout
	case errors.Is(err, engines.ErrReplyTooLarge):
		// The engine refused the reply while reading it: the outputs are
		// over the node's limits, like those checkOutputs refuses.
		r.reason = deadletter.ReasonOutputLimit
	case errors.Is(err, engines.ErrInvalidOutput):
		// Returned, but with outputs that cannot be published: the same
		// input returns them again (retryCannotFix).
		r.reason = deadletter.ReasonOutputInvalid
	case errors.Is(err, engines.ErrWorkerFailed):
		r.reason = deadletter.ReasonWorkerFailed
	default:
		r.reason = deadletter.ReasonInternal
	}
}

// ErrorSuffix ends the type of a default error response: an input of type
// T answered with an error gets one of type T + ".error" (the DevKits'
// Error responses are named the same way, after their response type).
const ErrorSuffix = ".error"

// errorResponse is the default error response to m, for a worker that
// answered with an error and gave no response of its own: type
// "<input type>.error", data {"error": message, "input_id", "input_type"}
// as the DevKits' Error builds it; outputs.go completes its id, source and
// correlation id like any output's.
func errorResponse(m *message, message string) event.Event {
	ev := event.New(event.CloudEventsVersionV1)
	ev.SetType(m.ev.Type() + ErrorSuffix)
	data, _ := json.Marshal(map[string]string{"error": message, "input_id": m.ev.ID(), "input_type": m.ev.Type()})
	ev.DataEncoded = data
	ev.SetDataContentType(event.ApplicationJSON)
	return ev
}
