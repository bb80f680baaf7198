package placement

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// HostMemory is the memory this process may use: its cgroup's limit when
// it has one, else the machine's (MemTotal); 0 when neither can be read.
func HostMemory() uint64 {
	if b, err := os.ReadFile("/sys/fs/cgroup/memory.max"); err == nil {
		if v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil {
			return v
		}
	}
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err == nil {
				return kb * 1024
			}
		}
	}
	return 0
}

// Engines is the set of engines whose runtime check passed on this node
// (what it advertises: NodeInfo.Engines). Safe for concurrent use.
type Engines struct {
	mu  sync.Mutex
	set map[string]bool
}

// Set records engine as healthy or not.
func (e *Engines) Set(engine string, healthy bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.set == nil {
		e.set = map[string]bool{}
	}
	e.set[engine] = healthy
}

// Healthy lists the healthy engines, sorted.
func (e *Engines) Healthy() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for n, ok := range e.set {
		if ok {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// ParseLabels parses NODE_LABELS ("zone=a,pool=cpu"): keys and values
// non-empty, at most 63 characters of [A-Za-z0-9._/-].
func ParseLabels(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("label %q is not key=value", kv)
		}
		if err := ValidLabel(k, v); err != nil {
			return nil, err
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("label %q is given twice", k)
		}
		out[k] = v
	}
	return out, nil
}

// MaxLabelLen bounds a label's key and its value.
const MaxLabelLen = 63

// ValidLabel checks one label's key and value (NODE_LABELS,
// placement.require at CreateWorker): each 1 to MaxLabelLen of A-Z a-z 0-9
// . _ - /.
func ValidLabel(k, v string) error {
	if err := CheckLabelPart("key", k); err != nil {
		return fmt.Errorf("label %q: %w", k, err)
	}
	if err := CheckLabelPart("value", v); err != nil {
		return fmt.Errorf("label %q: %w", k, err)
	}
	return nil
}

// CheckLabelPart checks a label's key or value (what), saying what is
// wrong and where.
func CheckLabelPart(what, s string) error {
	if s == "" || len(s) > MaxLabelLen {
		return fmt.Errorf("%s %q must be 1 to %d characters long", what, s, MaxLabelLen)
	}
	for i, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == '/') {
			return fmt.Errorf("%s %q has %q at position %d; allowed: A-Z a-z 0-9 . _ - /", what, s, c, i)
		}
	}
	return nil
}
