package dispatch

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// Bounds of an input's attributes (all but its data), checked before
// anything reads them: a worker copies the input's id (into its outputs'
// ids), its correlation id and trace state into every output, so an
// unbounded attribute would be multiplied by MAX_OUTPUTS_PER_MESSAGE. An
// input over them is dead-lettered at once, reason too_large.
const (
	// MaxInputIDBytes bounds an input's id.
	MaxInputIDBytes = 1 << 10
	// MaxInputAttributeBytes bounds an input's attributes and extensions
	// together (id, source, type, content type, each extension's name and
	// value).
	MaxInputAttributeBytes = 8 << 10
	// maxPlainOutputID: an input id up to this long is used as it is in
	// its outputs' default ids, a longer one by its hash.
	maxPlainOutputID = 64
)

// checkInputAttributes says why req's attributes are over the bounds
// above (nil: they are not).
func checkInputAttributes(req *runtimev1.TopicEventRequest) error {
	if n := len(req.GetId()); n > MaxInputIDBytes {
		return fmt.Errorf("the event's id is %d bytes, more than %d", n, MaxInputIDBytes)
	}
	n := len(req.GetId()) + len(req.GetSource()) + len(req.GetType()) + len(req.GetSpecVersion()) + len(req.GetDataContentType())
	for k, v := range req.GetExtensions().GetFields() {
		if n > MaxInputAttributeBytes {
			break
		}
		n += len(k) + valueSize(v)
	}
	if n > MaxInputAttributeBytes {
		return fmt.Errorf("the event's attributes and extensions take %d bytes or more, more than %d", n, MaxInputAttributeBytes)
	}
	return nil
}

// valueSize is about the size of an extension's value as it is published.
func valueSize(v *structpb.Value) int {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return len(k.StringValue)
	case *structpb.Value_StructValue, *structpb.Value_ListValue:
		return proto.Size(v)
	default:
		return 8
	}
}

// outputIDBase is the part of an output's default id that names its
// input: the input's id when it is short, else a hash of it (the same for
// every delivery: deduplication downstream relies on output ids).
func outputIDBase(id string) string {
	if len(id) <= maxPlainOutputID {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "sha256:" + hex.EncodeToString(sum[:16])
}

// logID is an event id as it is logged: an id from a message that was not
// checked yet may be of any size.
func logID(id string) string {
	if len(id) <= 2*maxPlainOutputID {
		return id
	}
	return id[:maxPlainOutputID] + "... (" + outputIDBase(id) + ")"
}

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
// EventContextV1.SetExtension; other kinds go through it. The optional
// context attributes Dapr passes among the extensions (subject, time,
// dataschema: TopicEventRequest has no fields for them) are set as the
// attributes they are; SetExtension refuses spec attributes, so they were
// dropped before (a worker never saw an event's subject).
func setExtension(ec *event.EventContextV1, k string, v *structpb.Value) error {
	s, isString := v.GetKind().(*structpb.Value_StringValue)
	switch {
	case isString && validExtensionName(k) && !isSpecAttribute(k):
		ec.Extensions[k] = s.StringValue
		return nil
	case k == "subject" && isString:
		if s.StringValue != "" {
			ec.Subject = &s.StringValue
		}
		return nil
	case k == "time" && isString:
		t, err := types.ParseTime(s.StringValue)
		if err != nil {
			return err
		}
		ec.Time = &types.Timestamp{Time: t}
		return nil
	case k == "dataschema" && isString:
		u := types.ParseURI(s.StringValue)
		if u == nil {
			return fmt.Errorf("dataschema %q is not a URI", s.StringValue)
		}
		ec.DataSchema = u
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
