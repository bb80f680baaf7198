package node

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/catalog"
)

// quarantineMark prefixes the code sha recorded as attached for a worker
// attached quarantined (quarantinedInstance), so that the apply after its
// quarantine is lifted loads its code.
const quarantineMark = "quarantined:"

// quarantineState is what the node knows of quarantines besides the
// catalog's records: those its own crash journal asked for at start (kept
// until the record is written, so that nothing loads the worker before),
// and whom to tell when a worker it had quarantined loads again.
type quarantineState struct {
	mu     sync.Mutex
	local  map[string]catalog.Quarantine
	lifted func(id string)
}

// Quarantine makes this node treat worker id as quarantined until the
// catalog's record of it (catalog.SetQuarantine) is written and later
// cleared: the node's start calls it for the workers its crash journal
// reports, before anything is loaded.
func (n *Node) Quarantine(id string, q catalog.Quarantine) {
	n.quarantine.mu.Lock()
	defer n.quarantine.mu.Unlock()
	if n.quarantine.local == nil {
		n.quarantine.local = map[string]catalog.Quarantine{}
	}
	n.quarantine.local[id] = q
}

// QuarantineRecorded ends Quarantine's local hold on id: the catalog's
// record says it from now on (and its clearing lifts it).
func (n *Node) QuarantineRecorded(id string) {
	n.quarantine.mu.Lock()
	defer n.quarantine.mu.Unlock()
	delete(n.quarantine.local, id)
}

// OnQuarantineLifted sets what is called when a worker this node had
// attached quarantined loads its code again (its quarantine was cleared):
// the crash journal forgets its counts. Call it before serving.
func (n *Node) OnQuarantineLifted(f func(id string)) { n.quarantine.lifted = f }

// quarantined tells whether worker w is quarantined, and why. Only calls
// into code that runs inside a node are journaled (engines/crashjournal),
// so only a worker whose engine runs it in this node's process can be
// quarantined here: for the others (Python, .NET, native workers in host
// processes) the catalog is not read, which spares a state read per worker
// and reconcile pass. A node that runs native workers isolated therefore
// serves a worker that an in-process node quarantined: it cannot crash.
func (n *Node) quarantined(ctx context.Context, w catalog.Worker) (catalog.Quarantine, bool, error) {
	n.quarantine.mu.Lock()
	q, ok := n.quarantine.local[w.ID]
	n.quarantine.mu.Unlock()
	if ok {
		return q, true, nil
	}
	if e, err := n.engines.Lookup(w.MIMEType); err == nil && !e.Info().Capabilities.InProcess {
		return catalog.Quarantine{}, false, nil
	}
	return n.catalog.GetQuarantine(ctx, w.ID)
}

// unquarantined is called when worker id's code was attached; was is what
// was attached before.
func (n *Node) unquarantined(id, was string) {
	if strings.HasPrefix(was, quarantineMark) && n.quarantine.lifted != nil {
		n.log.Info("worker quarantine lifted: its code is loaded again", "worker_id", id)
		n.quarantine.lifted(id)
	}
}

// quarantinedInstance stands in for a quarantined worker's code, which is
// not loaded: its topic stays subscribed, so that the events that crashed
// the node are dead-lettered as crashed (dispatch.Config.Suspect, before
// any engine is called), and every other message is given back unrun
// (RETRY, not an attempt): it waits, as for a stopped worker, until a
// LoadCode or StartWorker lifts the quarantine.
type quarantinedInstance struct {
	id, reason string
}

func (q quarantinedInstance) Process(context.Context, *event.Event) ([]event.Event, error) {
	return nil, fmt.Errorf("worker %s is %s: %w", q.id, q.reason, engines.ErrGivenBack)
}

func (quarantinedInstance) Close(context.Context) error { return nil }
