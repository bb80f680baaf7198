package devstack

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// DevNode is one worker node of `make run -nodes N`: the first is the node
// `make run` has always started (id "local", log node.log, the stack's
// daprd, NODE_STATE_DIR <Dir>/node-state); node N after it is "node-N",
// with its own log, daprd (same app id, AppID, so the nodes share the
// topics' consumer groups) and state directory.
type DevNode struct {
	// N is the node's number, from 1.
	N int
	// Labels is the node's NODE_LABELS ("zone=a,pool=cpu"; empty: unset).
	Labels string
}

// ID is the node's WORKMANAGER_NODE_ID.
func (n DevNode) ID() string {
	if n.N <= 1 {
		return "local"
	}
	return "node-" + strconv.Itoa(n.N)
}

// LogName is the name of the node's log in the stack's folder (LogName.log).
func (n DevNode) LogName() string {
	if n.N <= 1 {
		return "node"
	}
	return "node-" + strconv.Itoa(n.N)
}

// SidecarName is the name of the node's daprd log: the stack's own daprd
// for the first node.
func (n DevNode) SidecarName() string {
	if n.N <= 1 {
		return "daprd"
	}
	return "daprd-" + strconv.Itoa(n.N)
}

// Name names the node in reports (the supervisor's restart lines).
func (n DevNode) Name() string {
	if n.N <= 1 {
		return "worker node"
	}
	return "worker node " + n.ID()
}

// StateDir is the node's NODE_STATE_DIR under the stack folder dir
// (its crash journal, kept across its restarts).
func (n DevNode) StateDir(dir string) string {
	if n.N <= 1 {
		return filepath.Join(dir, "node-state")
	}
	return filepath.Join(dir, "node-state-"+strconv.Itoa(n.N))
}

// Env is what the node gets on top of the stack's environment: NodeEnv
// with the node's id, and its NODE_LABELS when it has labels.
func (n DevNode) Env(getenv func(string) string) []string {
	env := NodeEnv(getenv)
	for i, kv := range env {
		if strings.HasPrefix(kv, "WORKMANAGER_NODE_ID=") {
			env[i] = "WORKMANAGER_NODE_ID=" + n.ID()
		}
	}
	if n.Labels != "" {
		env = append(env, "NODE_LABELS="+n.Labels)
	}
	return env
}

// DevNodes plans the n nodes of `make run -nodes n -node-labels labels`:
// labels lists the nodes' NODE_LABELS in order, separated by ';' ("zone=a;
// zone=b;zone=c"), each a ','-separated list of key=value; nodes past the
// list's end, and empty entries, get none.
func DevNodes(n int, labels string) ([]DevNode, error) {
	if n < 1 {
		return nil, fmt.Errorf("-nodes must be at least 1, got %d", n)
	}
	var each []string
	if strings.TrimSpace(labels) != "" {
		each = strings.Split(labels, ";")
	}
	if len(each) > n {
		return nil, fmt.Errorf("-node-labels lists %d nodes' labels (separated by ';') but -nodes is %d", len(each), n)
	}
	nodes := make([]DevNode, n)
	for i := range nodes {
		nodes[i].N = i + 1
		if i < len(each) {
			l, err := normalLabels(each[i])
			if err != nil {
				return nil, fmt.Errorf("-node-labels, node %d: %w", i+1, err)
			}
			nodes[i].Labels = l
		}
	}
	return nodes, nil
}

// normalLabels checks one node's labels, "key=value,key=value", and
// returns them without blanks around the items.
func normalLabels(s string) (string, error) {
	var out []string
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		k, v, ok := strings.Cut(item, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || strings.ContainsAny(k+v, " \t;=") {
			return "", fmt.Errorf("label %q is not key=value", item)
		}
		out = append(out, k+"="+v)
	}
	return strings.Join(out, ","), nil
}

// StartDevNode starts node n of `make run` (bin, serving HTTP on httpAddr)
// on the daprd whose gRPC API is at daprGRPCAddr, with its log, id,
// NODE_STATE_DIR and labels; env is added last. For the first node on
// the stack's daprd it is StartNode with NodeEnv, as `make run` has always
// started its node.
func (s *Stack) StartDevNode(bin, httpAddr string, n DevNode, daprGRPCAddr string, getenv func(string) string, env ...string) (*Proc, error) {
	var extra []string
	if daprGRPCAddr != "" && daprGRPCAddr != s.DaprGRPCAddr {
		extra = append(extra, "DAPR_GRPC_ADDRESS="+daprGRPCAddr)
	}
	extra = append(append(extra, n.Env(getenv)...), env...)
	return s.startNodeAs(bin, n.LogName(), httpAddr, n.StateDir(s.Dir), extra...)
}
