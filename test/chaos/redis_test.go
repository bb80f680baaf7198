package chaos

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// A minimal RESP client: the checker reads the topics' Redis streams (what
// daprd's Redis pub/sub writes, in publish order, with the broker's own
// timestamps) without depending on daprd or the node.
type resp struct {
	c  net.Conn
	rd *bufio.Reader
}

func dialRedis(addr string) (*resp, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return &resp{c: c, rd: bufio.NewReader(c)}, nil
}

func (r *resp) close() { r.c.Close() }

func (r *resp) do(args ...string) (any, error) {
	_ = r.c.SetDeadline(time.Now().Add(30 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(r.c, b.String()); err != nil {
		return nil, err
	}
	return r.read()
}

func (r *resp) read() (any, error) {
	line, err := r.rd.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty RESP line")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return nil, errors.New(line[1:])
	case ':':
		return strconv.ParseInt(line[1:], 10, 64)
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r.rd, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = r.read(); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("unexpected RESP line %q", line)
}

// entry is one message of a topic's stream: the CloudEvent daprd stored
// and the time Redis took it (from the entry id).
type entry struct {
	sid string // the stream entry id
	at  time.Time
	ce  map[string]any
}

func (e entry) str(k string) string {
	v, ok := e.ce[k]
	if !ok || v == nil {
		return ""
	}
	if s, ok := v.(string); ok {
		return s
	}
	return fmt.Sprint(v)
}

func (e entry) data() map[string]any {
	d, _ := e.ce["data"].(map[string]any)
	return d
}

// readStream returns every entry of stream key in order.
func readStream(addr, key string) ([]entry, error) {
	r, err := dialRedis(addr)
	if err != nil {
		return nil, err
	}
	defer r.close()
	var out []entry
	start := "-"
	for {
		v, err := r.do("XRANGE", key, start, "+", "COUNT", "1000")
		if err != nil {
			return nil, fmt.Errorf("XRANGE %s: %w", key, err)
		}
		items, _ := v.([]any)
		if len(items) == 0 {
			return out, nil
		}
		for _, it := range items {
			pair, _ := it.([]any)
			if len(pair) != 2 {
				continue
			}
			id, _ := pair[0].(string)
			start = "(" + id
			ms, _ := strconv.ParseInt(strings.SplitN(id, "-", 2)[0], 10, 64)
			fields, _ := pair[1].([]any)
			e := entry{sid: id, at: time.UnixMilli(ms)}
			for i := 0; i+1 < len(fields); i += 2 {
				if f, _ := fields[i].(string); f == "data" {
					raw, _ := fields[i+1].(string)
					dec := json.NewDecoder(strings.NewReader(raw))
					dec.UseNumber() // nanosecond times do not fit a float64
					_ = dec.Decode(&e.ce)
				}
			}
			if e.ce != nil {
				out = append(out, e)
			}
		}
	}
}

func decodeJSON(r io.Reader, v any) error { return json.NewDecoder(io.LimitReader(r, 1<<20)).Decode(v) }

// pendingEntries describes the entries of stream key still pending in its
// consumer groups (delivered, not acked): entry id → "pending in group G,
// delivered N times, idle D". The checker adds it to counter-examples: a
// message the broker still holds was not acked, one it does not was.
func pendingEntries(addr, key string) (map[string]string, error) {
	r, err := dialRedis(addr)
	if err != nil {
		return nil, err
	}
	defer r.close()
	v, err := r.do("XINFO", "GROUPS", key)
	if err != nil {
		if strings.Contains(err.Error(), "no such key") {
			return map[string]string{}, nil
		}
		return nil, fmt.Errorf("XINFO GROUPS %s: %w", key, err)
	}
	out := map[string]string{}
	groups, _ := v.([]any)
	for _, g := range groups {
		fields, _ := g.([]any)
		name := ""
		for i := 0; i+1 < len(fields); i += 2 {
			if f, _ := fields[i].(string); f == "name" {
				name, _ = fields[i+1].(string)
			}
		}
		if name == "" {
			continue
		}
		start := "-"
		for {
			v, err := r.do("XPENDING", key, name, start, "+", "1000")
			if err != nil {
				return nil, fmt.Errorf("XPENDING %s %s: %w", key, name, err)
			}
			items, _ := v.([]any)
			for _, it := range items {
				f, _ := it.([]any)
				if len(f) < 4 {
					continue
				}
				id, _ := f[0].(string)
				idle, _ := f[2].(int64)
				n, _ := f[3].(int64)
				out[id] = fmt.Sprintf("pending in group %s, delivered %d times, idle %s", name, n, (time.Duration(idle) * time.Millisecond).Round(time.Second))
				start = "(" + id
			}
			if len(items) < 1000 {
				break
			}
		}
	}
	return out, nil
}
