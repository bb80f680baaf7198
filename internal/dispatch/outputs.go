package dispatch

// Stage 5 of a message, for one worker: its outputs. Every output is
// completed (id, source, correlation id) and checked against the worker's
// output policy and the node's limits before any is published; a grouped
// worker's outputs carry its fencing token and are published only while
// its lease is still the group's lock. Then the attempt is finished
// (settle.go).

import (
	"context"
	"fmt"
	"net/url"
	"strconv"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/publish"
	"github.com/virtufin/workmanager/internal/workerpolicy"
)

// publishAll publishes outs, the outputs of w's call at j's message, each
// to the topic named by its type: all of them or, on the first refusal,
// none after it; j.r says how it went. It returns once it is done with
// outs (a grouped call's, once they went out in their turn).
func (d *Dispatcher) publishAll(ctx context.Context, w *worker, j *job, outs []event.Event) {
	m, r, lease := j.m, j.r, j.lease
	// Every output is checked before any is published: a call is
	// published whole or not at all.
	if reason, err := d.checkOutputs(w, m, outs); err != nil {
		r.outcome, r.reason, r.err = outcomeFailed, reason, err
		return
	}
	if !d.serving() {
		// Lost the cluster membership during the call (paused, store
		// unreachable): a stop may have been announced meanwhile, so
		// nothing is published; the message comes back (see record).
		r.outcome = outcomeCut
		return
	}
	var tp, ts string
	if j.span != nil {
		tp, ts = d.traceContext(ctx)
	} else {
		tp, ts = inputTraceContext(m) // tracing off: pass the input's on, or start one
	}
	if lease != nil && len(outs) > 0 {
		// A grouped call's outputs go out in token order (turns.go).
		d.publishInTurn(ctx, w, j, outs, tp, ts)
		return
	}
	for i := range outs {
		o := &outs[i]
		setTraceContext(o, tp, ts)
		if err := d.Pub.Publish(ctx, o.Type(), o); err != nil {
			r.outcome, r.reason, r.err = outcomeFailed, deadletter.ReasonPublishFailed, err
			return
		}
		w.m.Outputs.Inc()
		j.outputs++
	}
	r.outcome = outcomeDone
}

// checkOutputs completes every output (id, source, correlation id) and
// holds them to the worker's output policy and the node's output limits;
// a refusal is the worker's failure, with the rule's name in the error.
func (d *Dispatcher) checkOutputs(w *worker, m *message, outs []event.Event) (deadletter.Reason, error) {
	if n := len(outs); n > d.cfg.MaxOutputs {
		return deadletter.ReasonOutputLimit, fmt.Errorf("%w: %d outputs, more than MAX_OUTPUTS_PER_MESSAGE %d", engines.ErrWorkerFailed, n, d.cfg.MaxOutputs)
	}
	idBase := ""
	if len(outs) > 0 {
		idBase = outputIDBase(m.id)
	}
	for i := range outs {
		o := &outs[i]
		if err := d.completeOutput(w, m, o, i, idBase); err != nil {
			return deadletter.ReasonOutputInvalid, err
		}
		if err := workerpolicy.CheckOutput(w.TopicPrefix, w.AllowedOutputs, w.Topic, o.Type()); err != nil {
			return deadletter.ReasonOutputPolicy, fmt.Errorf("%w: output %d: %w", engines.ErrWorkerFailed, i, err)
		}
		if n := len(o.DataEncoded); n > d.cfg.MaxOutputBytes {
			return deadletter.ReasonOutputLimit, fmt.Errorf("%w: output %d: %d bytes of data, more than MAX_OUTPUT_BYTES %d", engines.ErrWorkerFailed, i, n, d.cfg.MaxOutputBytes)
		}
		if n := publish.AttributesSize(o.Context.(*event.EventContextV1), MaxOutputAttributeBytes); n > MaxOutputAttributeBytes {
			return deadletter.ReasonOutputLimit, fmt.Errorf("%w: output %d: its attributes and extensions take %d bytes or more, more than %d", engines.ErrWorkerFailed, i, n, MaxOutputAttributeBytes)
		}
	}
	return "", nil
}

// MaxOutputAttributeBytes bounds an output's attributes and extensions
// (its encoded size beyond its data, as the reply limit allows for it),
// the input's correlation id included.
const MaxOutputAttributeBytes = engines.ReplyOutputOverhead

// completeOutput fills an output's defaults (id derived from the input's
// id (idBase: outputIDBase, a hash of a long id) and source, so a
// redelivery yields the same ids and two inputs with one id from two
// sources do not; source naming the worker), drops the
// control extensions the worker wrote (ControlExtension) and sets its
// correlation id: the input's, copied when present and absent when absent.
func (d *Dispatcher) completeOutput(w *worker, m *message, o *event.Event, i int, idBase string) error {
	if o.Context == nil {
		return fmt.Errorf("%w: %w: output %d is empty", engines.ErrWorkerFailed, engines.ErrInvalidOutput, i)
	}
	oc, ok := o.Context.(*event.EventContextV1)
	if !ok {
		oc = o.Context.AsV1()
		o.Context = oc
	}
	if oc.Type == "" {
		return fmt.Errorf("%w: %w: output %d has no type", engines.ErrWorkerFailed, engines.ErrInvalidOutput, i)
	}
	if oc.ID == "" {
		oc.ID = idBase + "/" + w.ID + "/" + strconv.Itoa(i) + "/" + m.srcTag
	}
	if oc.Source.URL == (url.URL{}) {
		oc.Source = w.source
	}
	for k := range oc.Extensions {
		if ControlExtension(k) { // only the node sets them (fencingtoken, below)
			delete(oc.Extensions, k)
		}
	}
	if m.hasCorrelation {
		if oc.Extensions == nil {
			oc.Extensions = make(map[string]any, 1)
		}
		oc.Extensions[CorrelationExtension] = m.correlation
	} else {
		delete(oc.Extensions, CorrelationExtension)
	}
	return nil
}
