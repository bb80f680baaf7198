package dispatch

import (
	"fmt"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
	"google.golang.org/protobuf/types/known/structpb"
)

// sourceCache remembers the last parsed source: the events of one topic
// usually share it, and parsing a URI reference is the costliest step of
// decoding. Not safe for concurrent use (one per topic stream goroutine).
type sourceCache struct {
	raw    string
	parsed types.URIRef
}

func (c *sourceCache) get(raw string) (types.URIRef, error) {
	if c != nil && c.raw == raw && raw != "" {
		return c.parsed, nil
	}
	p := types.ParseURIRef(raw)
	if p == nil {
		return types.URIRef{}, fmt.Errorf("source %q is not a URI reference", raw)
	}
	if c != nil {
		c.raw, c.parsed = raw, *p
	}
	return *p, nil
}

// Decode turns a Dapr TopicEventRequest into a CloudEvent v1.0, keeping its
// extensions (correlationid, traceparent, ...). Data and the content type are
// shared with req, not copied.
func Decode(req *runtimev1.TopicEventRequest, e *event.Event) error {
	return decode(req, e, new(event.EventContextV1), nil)
}

// decode fills e with ec as its context (so a pooled message can reuse both).
func decode(req *runtimev1.TopicEventRequest, e *event.Event, ec *event.EventContextV1, sources *sourceCache) error {
	if sv := req.GetSpecVersion(); sv != "" && sv != event.CloudEventsVersionV1 {
		return fmt.Errorf("CloudEvent %q: unsupported specversion %q", req.GetId(), sv)
	}
	if req.GetId() == "" || req.GetType() == "" || req.GetSource() == "" {
		return fmt.Errorf("CloudEvent %q: id, source and type are required (source %q, type %q)", req.GetId(), req.GetSource(), req.GetType())
	}
	src, err := sources.get(req.GetSource())
	if err != nil {
		return fmt.Errorf("CloudEvent %q: %w", req.GetId(), err)
	}
	ext := ec.Extensions // a pooled context keeps its (cleared) map
	clear(ext)
	*ec = event.EventContextV1{ID: req.Id, Type: req.Type, Source: src}
	if req.DataContentType != "" {
		ec.DataContentType = &req.DataContentType
	}
	if fields := req.GetExtensions().GetFields(); len(fields) > 0 {
		if ext == nil {
			ext = make(map[string]any, len(fields))
		}
		ec.Extensions = ext
		for k, v := range fields {
			if err := setExtension(ec, k, v); err != nil {
				// Dapr adds a few attributes of its own; one that cannot be
				// carried is dropped rather than failing the message.
				continue
			}
		}
	}
	*e = event.Event{Context: ec, DataEncoded: req.GetData()}
	return nil
}

// setExtension stores string values without the reflection and copies of
// EventContextV1.SetExtension; other kinds go through it.
func setExtension(ec *event.EventContextV1, k string, v *structpb.Value) error {
	if s, ok := v.GetKind().(*structpb.Value_StringValue); ok && validExtensionName(k) && !isSpecAttribute(k) {
		ec.Extensions[k] = s.StringValue
		return nil
	}
	return ec.SetExtension(k, v.AsInterface())
}

func validExtensionName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func isSpecAttribute(k string) bool {
	switch k {
	case "specversion", "id", "source", "type", "datacontenttype", "dataschema", "subject", "time", "data", "data_base64":
		return true
	}
	return false
}
