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
			return nil, labelError("label %q is not key=value", kv)
		}
		if err := ValidLabel(k, v); err != nil {
			return nil, err
		}
		if _, dup := out[k]; dup {
			return nil, labelError("label %q is given twice", k)
		}
		out[k] = v
	}
	return out, nil
}

// ValidLabel checks one label's key and value.
func ValidLabel(k, v string) error {
	for _, s := range []string{k, v} {
		if s == "" || len(s) > 63 {
			return labelError("label %q=%q: keys and values must be 1 to 63 characters", k, v)
		}
		for _, r := range s {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._/-", r)) {
				return labelError("label %q=%q: only letters, digits and . _ / - are allowed", k, v)
			}
		}
	}
	return nil
}

func labelError(f string, a ...any) error { return fmt.Errorf(f, a...) }
