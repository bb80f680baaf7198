package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/virtufin/workmanager/internal/state"
)

// MarkDeleted records in worker id's tombstone that the worker existed
// (its deleted event is being published) before it was deleted, so that
// its id is never created again (Deleted reports it): a name, and a
// request id, stay taken after Temporal's retention purged the deleted
// worker's workflow, which alone refused a new run of that id (issue 43
// item 13). A failed create's undo leaves an unmarked tombstone: its
// request may be tried again. Nothing to mark (no tombstone: a live record
// of a later incarnation, or none): nil.
func (c *Catalog) MarkDeleted(ctx context.Context, id string) error {
	for conflicts := 0; ; conflicts++ {
		if err := state.ConflictBackoff(ctx, conflicts); err != nil {
			return err
		}
		cur, etag, err := c.stored(ctx, id)
		if err != nil || cur == nil || !cur.Deleted || cur.Existed {
			return err
		}
		cur.Existed = true
		b, err := json.Marshal(cur)
		if err != nil {
			return err
		}
		if err := c.store.Put(ctx, workerKey(id), b, state.PutOptions{ETag: etag}); !errors.Is(err, state.ErrConflict) {
			return err
		}
	}
}

// Deleted reports whether id belongs to a worker that was created and
// deleted (MarkDeleted): a create of that id is refused.
func (c *Catalog) Deleted(ctx context.Context, id string) (bool, error) {
	cur, _, err := c.stored(ctx, id)
	if err != nil {
		return false, err
	}
	return cur != nil && cur.Deleted && cur.Existed, nil
}

// notRecoveredKey holds why recovery could not bring worker id back
// (NotRecovered).
func notRecoveredKey(id string) string { return workersPrefix + id + "/not-recovered" }

// NotRecovered is why the last recovery could not bring a worker back; it
// is kept until the worker loads again on a node (ClearNotRecovered) or
// is deleted.
type NotRecovered struct {
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// maxNotRecoveredReason bounds the stored reason (an activity's failure
// text, up to 16 KiB, with an engine's output in it).
const maxNotRecoveredReason = 2 << 10

// SetNotRecovered records why recovery could not bring worker id back.
func (c *Catalog) SetNotRecovered(ctx context.Context, id, reason string, at time.Time) error {
	if len(reason) > maxNotRecoveredReason {
		n := maxNotRecoveredReason - 3
		for n > 0 && !utf8.RuneStart(reason[n]) {
			n--
		}
		reason = reason[:n] + "..."
	}
	b, err := json.Marshal(NotRecovered{Reason: reason, At: at.UTC()})
	if err != nil {
		return err
	}
	if err := c.store.Put(ctx, notRecoveredKey(id), b, state.PutOptions{}); err != nil {
		return fmt.Errorf("record why worker %s was not recovered: %w", id, err)
	}
	return nil
}

// GetNotRecovered returns why recovery could not bring worker id back, or
// ok false when it was recovered (or loaded since).
func (c *Catalog) GetNotRecovered(ctx context.Context, id string) (NotRecovered, bool, error) {
	it, err := c.store.Get(ctx, notRecoveredKey(id))
	if errors.Is(err, state.ErrNotFound) {
		return NotRecovered{}, false, nil
	}
	if err != nil {
		return NotRecovered{}, false, err
	}
	var n NotRecovered
	if err := json.Unmarshal(it.Value, &n); err != nil {
		return NotRecovered{}, false, fmt.Errorf("decode why worker %s was not recovered: %w", id, err)
	}
	return n, true, nil
}

// ClearNotRecovered forgets why worker id was not recovered: it loaded on
// a node since, or was deleted.
func (c *Catalog) ClearNotRecovered(ctx context.Context, id string) error {
	return c.store.Delete(ctx, notRecoveredKey(id), "")
}
