package catalog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

const quarantinePrefix = state.KeyPrefix + "quarantine/"

// Quarantine is why no node loads a worker: it crashed a node's process
// (an in-process native worker) repeatedly (engines/crashjournal). It
// lasts until a LoadCode, a rollback or a StartWorker clears it.
type Quarantine struct {
	Crashes   int       `json:"crashes"`
	LastEvent string    `json:"last_event,omitempty"`
	Node      string    `json:"node,omitempty"`
	At        time.Time `json:"at"`
}

// Reason is the quarantine as Worker.status_reason says it.
func (q Quarantine) Reason() string {
	last := ""
	if q.LastEvent != "" {
		last = " (last event " + q.LastEvent + ")"
	}
	return fmt.Sprintf("quarantined: crashed the node %d times%s; reload or start it to try again", q.Crashes, last)
}

// SetQuarantine records worker id's quarantine; an existing one is
// replaced by the one with more crashes (a conditional write: two nodes
// quarantining at once keep the larger count).
func (c *Catalog) SetQuarantine(ctx context.Context, id string, q Quarantine) error {
	return state.UpdateJSON(ctx, c.store, quarantinePrefix+id, func(cur **Quarantine) bool {
		if *cur != nil && (*cur).Crashes >= q.Crashes {
			return false
		}
		*cur = &q
		return true
	})
}

// GetQuarantine returns worker id's quarantine; ok is false when it has
// none.
func (c *Catalog) GetQuarantine(ctx context.Context, id string) (q Quarantine, ok bool, err error) {
	p, _, err := state.GetJSON[*Quarantine](ctx, c.store, quarantinePrefix+id)
	if err != nil {
		return Quarantine{}, false, fmt.Errorf("read the quarantine of worker %s: %w", id, err)
	}
	if p == nil {
		return Quarantine{}, false, nil
	}
	return *p, true, nil
}

// ClearQuarantine lifts worker id's quarantine (none: no-op); cleared
// reports whether there was one.
func (c *Catalog) ClearQuarantine(ctx context.Context, id string) (cleared bool, err error) {
	key := quarantinePrefix + id
	it, err := c.store.Get(ctx, key)
	if errors.Is(err, state.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read the quarantine of worker %s: %w", id, err)
	}
	if err := c.store.Delete(ctx, key, it.ETag); err != nil && !errors.Is(err, state.ErrConflict) {
		return false, fmt.Errorf("clear the quarantine of worker %s: %w", id, err)
	}
	return true, nil
}
