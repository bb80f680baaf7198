package wire

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
)

// A reply is untrusted bytes from the worker's process (the worker's code
// can write the reply frame itself). Before anything is allocated for it,
// DecodeOutputs walks the whole payload, counts its outputs and charges
// what decoding each would allocate: its bytes, costEvent for the event
// and costExtension for each extension (the figures of the native
// engine's verifier, engines/native/verify.go, measured for this decoder:
// TestDecodeOutputsMemoryIsAMultipleOfTheLimit). Over the reply limit, the
// reply is refused (ErrReplyTooLarge) having allocated nothing; under it,
// decoding allocates at most about twice the limit and keeps at most the
// limit.
const (
	costEvent     = 1024
	costExtension = 192
)

// Bounds of the texts of a worker's error report (an 'X' frame), applied
// where it is decoded: the node never carries, logs or matches a regexp
// over more. The type and the message keep their start, the traceback its
// end (the innermost frames).
const (
	MaxErrorType      = 256
	MaxErrorMessage   = 8 << 10
	MaxErrorTraceback = 16 << 10
	// maxOutputErrorText bounds the message of an output that cannot be
	// decoded (the CloudEvents decoder quotes what it did not like).
	maxOutputErrorText = 1 << 10
)

// report is the payload of an 'X' frame.
type report struct {
	Type      string `json:"type"`
	Message   string `json:"message"`
	Traceback string `json:"traceback"`
	// InvalidOutput: the runner refused the call's outputs (no "type", a
	// value it cannot encode): engines.ErrInvalidOutput.
	InvalidOutput bool `json:"invalid_output"`
}

// DecodeError turns an 'X' payload into an *Error of kind, its texts cut
// to MaxErrorType, MaxErrorMessage and MaxErrorTraceback.
func DecodeError(kind error, payload []byte) error {
	var w report
	if err := json.Unmarshal(payload, &w); err != nil {
		return fmt.Errorf("%w: undecodable error report from the worker process: %s", kind, Truncate(err.Error(), maxOutputErrorText))
	}
	return &Error{Kind: kind, Type: Truncate(w.Type, MaxErrorType), Message: Truncate(w.Message, MaxErrorMessage),
		Traceback: TruncateStart(w.Traceback, MaxErrorTraceback), InvalidOutput: w.InvalidOutput}
}

// Truncate returns s cut to at most n bytes, ending in "..." when it was
// cut, never inside a UTF-8 sequence. The result does not share s's
// memory when it was cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n < 3 {
		return strings.Clone(s[:n])
	}
	keep := n - 3
	for keep > 0 && keep < len(s) && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return s[:keep] + "..."
}

// TruncateStart is Truncate keeping the end of s: "..." and its last
// bytes.
func TruncateStart(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n < 3 {
		return strings.Clone(s[len(s)-n:])
	}
	from := len(s) - (n - 3)
	for from < len(s) && !utf8.RuneStart(s[from]) {
		from++
	}
	return "..." + s[from:]
}

// errTooLarge is the kind of a reply refused by DecodeOutputs for what
// decoding it would take.
var errTooLarge = fmt.Errorf("%w: %w", engines.ErrWorkerFailed, engines.ErrReplyTooLarge)

// DecodeOutputs turns an 'R' payload (null, one event object or a list of
// them) into events. Outputs need not have an id or source: the caller fills
// those in. limit is the reply limit (engines.ReplyLimit; <= 0:
// engines.MaxReplyLimit): a payload whose decoding would allocate more
// (see costEvent) is refused with an error wrapping ErrReplyTooLarge
// before anything is allocated for it.
func DecodeOutputs(payload []byte, limit int) ([]event.Event, error) {
	if limit <= 0 || limit > engines.MaxReplyLimit {
		limit = engines.MaxReplyLimit
	}
	i := skipSpace(payload, 0)
	if i == len(payload) {
		return nil, outputError(-1, errors.New("empty result"))
	}
	switch payload[i] {
	case 'n':
		return nil, nil
	case '{':
		end := skipValue(payload, i)
		if end < 0 || skipSpace(payload, end) != len(payload) {
			return nil, outputError(-1, errors.New("malformed JSON"))
		}
		cost, err := outputCost(payload[i:end])
		if err != nil {
			return nil, outputError(0, err)
		}
		if cost > int64(limit) {
			return nil, tooLarge(1, cost, limit)
		}
		out := make([]event.Event, 1)
		if err := decodeOutput(&out[0], payload[i:end]); err != nil {
			return nil, outputError(0, err)
		}
		return out, nil
	case '[':
		// Counted and charged first: nothing is allocated for a reply
		// that is refused.
		var n int
		var cost int64
		err := eachElement(payload, i, func(j int, elem []byte) error {
			n = j + 1
			if cost += costEvent; cost > int64(limit) {
				return errOverLimit
			}
			c, err := outputCost(elem)
			if err != nil {
				return outputError(j, err)
			}
			if cost += c - costEvent; cost > int64(limit) {
				return errOverLimit
			}
			return nil
		})
		if err == errOverLimit {
			return nil, tooLarge(n, cost, limit)
		}
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, nil
		}
		out := make([]event.Event, n)
		err = eachElement(payload, i, func(j int, elem []byte) error {
			if err := decodeOutput(&out[j], elem); err != nil {
				return outputError(j, err)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		return out, nil
	default:
		return nil, outputError(-1, fmt.Errorf("unexpected result %.40q", payload[i:]))
	}
}

var errOverLimit = errors.New("over the limit")

func tooLarge(n int, cost int64, limit int) error {
	return &Error{Kind: errTooLarge, Message: fmt.Sprintf(
		"decoding the outputs (%d so far, %d bytes of decoded events) would take more than the limit of %d bytes (MAX_OUTPUT_BYTES x MAX_OUTPUTS_PER_MESSAGE)",
		n, cost, limit)}
}

func outputError(i int, err error) error {
	var werr *Error
	if errors.As(err, &werr) {
		return err
	}
	return &Error{Kind: engines.ErrWorkerFailed, Message: Truncate(engines.OutputError(i, err), maxOutputErrorText), InvalidOutput: true}
}

// eachElement calls f with each element of the JSON list at b[i] ('['),
// which must end b but for white space; it stops at f's first error.
func eachElement(b []byte, i int, f func(j int, elem []byte) error) error {
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		if skipSpace(b, i+1) != len(b) {
			return outputError(-1, errors.New("malformed JSON after the list"))
		}
		return nil
	}
	for j := 0; ; j++ {
		end := skipValue(b, i)
		if end < 0 {
			return outputError(-1, fmt.Errorf("malformed JSON in element %d", j))
		}
		if err := f(j, b[i:end]); err != nil {
			return err
		}
		i = skipSpace(b, end)
		if i == len(b) {
			return outputError(-1, errors.New("unterminated list"))
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case ']':
			if skipSpace(b, i+1) != len(b) {
				return outputError(-1, errors.New("malformed JSON after the list"))
			}
			return nil
		default:
			return outputError(-1, fmt.Errorf("malformed JSON after element %d", j))
		}
	}
}

// isAttribute reports whether key (raw JSON, unescaped) names a context
// attribute or the data of a CloudEvent rather than an extension.
func isAttribute(key []byte) bool {
	switch string(key) {
	case "specversion", "id", "source", "type", "subject", "time", "datacontenttype", "dataschema",
		"data", "data_base64", "schemaurl", "datacontentencoding":
		return true
	}
	return false
}

// outputCost checks the shape of one output (an object whose extension
// values are strings, numbers, booleans or null) and returns what decoding
// it is charged.
func outputCost(elem []byte) (int64, error) {
	cost := int64(costEvent) + int64(len(elem))
	v1 := false
	err := eachMember(elem, func(key, val []byte) error {
		switch {
		case string(key) == "specversion":
			v1 = string(val) == `"1.0"`
		case isAttribute(key):
		default:
			cost += costExtension
			if val[0] == '{' || val[0] == '[' {
				return fmt.Errorf("extension %.64q: the value is not a string, number or boolean", key)
			}
		}
		return nil
	})
	if !v1 {
		// Decoded whole by the CloudEvents decoder, which copies the data
		// more than once.
		cost += 3 * int64(len(elem))
	}
	return cost, err
}

// eachMember calls f with each member of the JSON object b ('{' to its
// '}'): its key as written (without the quotes) and its value.
func eachMember(b []byte, f func(key, val []byte) error) error {
	if len(b) == 0 || b[0] != '{' {
		return errors.New("expected an object (a CloudEvent)")
	}
	i := skipSpace(b, 1)
	if i < len(b) && b[i] == '}' {
		return nil
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return errors.New("malformed JSON: expected a member name")
		}
		kEnd := skipString(b, i)
		if kEnd < 0 {
			return errors.New("malformed JSON: unterminated member name")
		}
		key := b[i+1 : kEnd-1]
		if err := checkName(key); err != nil {
			return err
		}
		i = skipSpace(b, kEnd)
		if i >= len(b) || b[i] != ':' {
			return errors.New("malformed JSON: expected ':'")
		}
		i = skipSpace(b, i+1)
		vEnd := skipValue(b, i)
		if vEnd < 0 {
			return fmt.Errorf("malformed JSON in member %.64q", key)
		}
		if err := f(key, b[i:vEnd]); err != nil {
			return err
		}
		i = skipSpace(b, vEnd)
		if i >= len(b) {
			return errors.New("malformed JSON: unterminated object")
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			if i != len(b)-1 {
				return errors.New("malformed JSON after the object")
			}
			return nil
		default:
			return errors.New("malformed JSON: expected ',' or '}'")
		}
	}
}

// checkName refuses member names that no attribute or extension has and
// that the CloudEvents decoder misreads (it stops at an empty name).
func checkName(key []byte) error {
	if len(key) == 0 {
		return errors.New("empty member name")
	}
	for _, c := range key {
		if c < 0x20 || c == '\\' {
			// Attribute and extension names are letters and digits.
			return fmt.Errorf("member name %.64q is escaped or has control characters", key)
		}
	}
	return nil
}

// decodeOutput decodes one output that outputCost accepted. Its data is
// decoded here, once (the CloudEvents decoder copies it up to five
// times); its attributes by the CloudEvents decoder.
func decodeOutput(ev *event.Event, elem []byte) error {
	var data, dataB64 []byte
	v1, datas := false, 0
	_ = eachMember(elem, func(key, val []byte) error {
		switch string(key) {
		case "specversion":
			v1 = string(val) == `"1.0"`
		case "data":
			data, datas = val, datas+1
		case "data_base64":
			dataB64, datas = val, datas+1
		}
		return nil
	})
	if !v1 || datas == 0 {
		return decodeEvent(ev, elem)
	}
	if datas > 1 {
		return errors.New(`more than one "data" or "data_base64"`)
	}
	attrs := make([]byte, 0, len(elem)-len(data)-len(dataB64))
	attrs = append(attrs, '{')
	_ = eachMember(elem, func(key, val []byte) error {
		if k := string(key); k == "data" || k == "data_base64" {
			return nil
		}
		if len(attrs) > 1 {
			attrs = append(attrs, ',')
		}
		attrs = append(attrs, '"')
		attrs = append(attrs, key...)
		attrs = append(attrs, '"', ':')
		attrs = append(attrs, val...)
		return nil
	})
	attrs = append(attrs, '}')
	if err := decodeEvent(ev, attrs); err != nil {
		return err
	}
	if dataB64 != nil {
		s, err := unquote(dataB64)
		if err != nil {
			return fmt.Errorf("data_base64: %w", err)
		}
		b := make([]byte, base64.StdEncoding.DecodedLen(len(s)))
		n, err := base64.StdEncoding.Decode(b, s)
		if err != nil {
			return fmt.Errorf("data_base64: %w", err)
		}
		ev.DataEncoded, ev.DataBase64 = b[:n], true
		return nil
	}
	mt, _ := ev.Context.GetDataMediaType()
	switch mt {
	case "", event.ApplicationJSON, event.TextJSON, event.ApplicationCloudEventsJSON, event.ApplicationCloudEventsBatchJSON:
		if !json.Valid(data) {
			return errors.New("data: malformed JSON")
		}
		ev.DataEncoded = bytes.Clone(data)
		return nil
	}
	if string(data) == "null" { // no data, as the CloudEvents decoder reads it
		ev.DataEncoded = []byte{}
		return nil
	}
	if data[0] != '"' {
		return fmt.Errorf("unexpected data payload for media type %q, expected a string", mt)
	}
	s, err := unquote(data)
	if err != nil {
		return fmt.Errorf("data: %w", err)
	}
	if len(s) > 0 && &s[0] == &data[1] { // not copied by unquote
		s = bytes.Clone(s)
	}
	ev.DataEncoded = s
	return nil
}

// decodeEvent decodes a CloudEvent with the CloudEvents decoder.
func decodeEvent(ev *event.Event, b []byte) error {
	if err := ev.UnmarshalJSON(b); err != nil {
		return err
	}
	if ev.Type() == "" {
		return errors.New(`missing required attribute "type"`)
	}
	return nil
}

// unquote returns the bytes of the JSON string q: a slice of q when it has
// no escape, else one new buffer of at most its length.
func unquote(q []byte) ([]byte, error) {
	if len(q) < 2 || q[0] != '"' || q[len(q)-1] != '"' {
		return nil, errors.New("expected a string")
	}
	body := q[1 : len(q)-1]
	for _, c := range body {
		if c < 0x20 {
			return nil, errors.New("control character in a string")
		}
	}
	i := bytes.IndexByte(body, '\\')
	if i < 0 {
		return body, nil
	}
	out := make([]byte, i, len(body))
	copy(out, body)
	for i < len(body) {
		c := body[i]
		if c != '\\' {
			out = append(out, c)
			i++
			continue
		}
		if i+1 >= len(body) {
			return nil, errors.New("malformed escape")
		}
		i += 2
		switch body[i-1] {
		case '"', '\\', '/':
			out = append(out, body[i-1])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := hex4(body, i)
			if !ok {
				return nil, errors.New("malformed \\u escape")
			}
			i += 4
			if utf16.IsSurrogate(r) {
				r2, ok := rune(0), false
				if i+6 <= len(body) && body[i] == '\\' && body[i+1] == 'u' {
					r2, ok = hex4(body, i+2)
				}
				if d := utf16.DecodeRune(r, r2); ok && d != utf8.RuneError {
					r, i = d, i+6
				} else {
					r = utf8.RuneError
				}
			}
			out = utf8.AppendRune(out, r)
		default:
			return nil, errors.New("malformed escape")
		}
	}
	return out, nil
}

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\t' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just past the JSON string at b[i] ('"'),
// or -1 when it is not terminated.
func skipString(b []byte, i int) int {
	j := i + 1
	for {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return -1
		}
		j += k
		bs := 0
		for bs < j-i-1 && b[j-1-bs] == '\\' {
			bs++
		}
		j++
		if bs%2 == 0 {
			return j
		}
	}
}

// skipValue returns the index just past the JSON value at b[i], or -1
// when there is none. It finds the value's end (strings, nesting) without
// recursion and without validating it: the decoder does.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end := skipString(b, j)
				if end < 0 {
					return -1
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	case ',', ':', '}', ']':
		return -1
	default:
		j := i
		for j < len(b) {
			switch b[j] {
			case ',', ']', '}', ':', ' ', '\n', '\t', '\r', '"', '{', '[':
				return j
			}
			j++
		}
		return j
	}
}
