package placement

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

// ErrStale: a write of a placement record older than the stored one (a late
// attempt of a write the placement workflow moved past).
var ErrStale = errors.New("stale placement record write")

// Store reads and writes the placement record and the nodes'
// advertisements.
type Store struct{ s state.Store }

// NewStore returns the placement store on s.
func NewStore(s state.Store) *Store { return &Store{s: s} }

// Load reads the placement record (the zero Record, revision 0, when none
// was written yet).
func (p *Store) Load(ctx context.Context) (Record, error) {
	r, _, err := state.GetJSON[Record](ctx, p.s, RecordKey)
	if err != nil {
		return Record{}, fmt.Errorf("read the placement record: %w", err)
	}
	return r, nil
}

// Save writes r if it is newer than the stored record: r.Revision must be
// above the stored one, else ErrStale (a retried write of the same
// revision that already landed is also ErrStale; callers that retry read
// the record back). The write is ETag-guarded.
func (p *Store) Save(ctx context.Context, r Record) error {
	var stale bool
	err := state.UpdateJSON(ctx, p.s, RecordKey, func(cur *Record) bool {
		if cur.Revision >= r.Revision {
			stale = true
			return false
		}
		*cur = r
		return true
	})
	if err != nil {
		return fmt.Errorf("write the placement record: %w", err)
	}
	if stale {
		return ErrStale
	}
	return nil
}

// Update reads the record, lets change modify it and writes it back with
// the next revision (ETag-guarded, starting over on a conflict). change
// returning false leaves it as it is. It returns the record as stored.
func (p *Store) Update(ctx context.Context, change func(*Record) bool) (Record, error) {
	var out Record
	err := state.UpdateJSON(ctx, p.s, RecordKey, func(cur *Record) bool {
		next := cur.Clone()
		if !change(&next) {
			out = *cur
			return false
		}
		next.Revision = cur.Revision + 1
		next.UpdatedAt = time.Now().UTC()
		*cur, out = next, next
		return true
	})
	if err != nil {
		return Record{}, fmt.Errorf("update the placement record: %w", err)
	}
	return out, nil
}

// Advertise writes node's advertisement (only that node writes its key;
// each write replaces the last, so a repeated one is harmless). ttl, when
// positive, lets the store drop it once the node stopped writing it.
func (p *Store) Advertise(ctx context.Context, n NodeInfo, ttl time.Duration) error {
	b, err := json.Marshal(n)
	if err != nil {
		return err
	}
	if err := p.s.Put(ctx, NodeInfoPrefix+n.ID, b, state.PutOptions{TTL: ttl}); err != nil {
		return fmt.Errorf("advertise node %s: %w", n.ID, err)
	}
	return nil
}

// Nodes reads the advertisements of ids (those without one are left out:
// a node that has not advertised yet can run nothing placed).
func (p *Store) Nodes(ctx context.Context, ids []string) ([]NodeInfo, error) {
	out := make([]NodeInfo, 0, len(ids))
	for _, id := range ids {
		n, _, err := state.GetJSON[NodeInfo](ctx, p.s, NodeInfoPrefix+id)
		if err != nil {
			return nil, fmt.Errorf("read node %s: %w", id, err)
		}
		if n.ID == "" {
			continue
		}
		out = append(out, n)
	}
	return out, nil
}
