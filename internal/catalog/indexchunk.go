package catalog

import (
	"context"
	"encoding/json"
	"slices"
)

// IndexChunkBytes bounds one chunk of the index (WorkerIDsChunk), counted
// as its JSON encoding: recovery takes the index in chunks, and each one
// is an activity result and at most what a recovery run carries into the
// next, so it must stay far below Temporal's 2 MiB payload limit whatever
// the number of workers (one page is 2.4 MB at a million workers).
const IndexChunkBytes = 128 << 10

// IndexCursor is where a listing of the index in chunks stands: the page,
// and the last id taken from it ("" at the start of the page). Page
// IndexPages is the end of the index.
type IndexCursor struct {
	Page  int
	After string `json:",omitempty"`
}

// Done tells that the whole index has been listed.
func (c IndexCursor) Done() bool { return c.Page >= IndexPages }

// IndexChunk is one chunk of the index and the cursor of the next.
type IndexChunk struct {
	IDs  []string
	Next IndexCursor
}

// WorkerIDsChunk returns the ids of page cur.Page that sort after
// cur.After, in byte order, as many as fit in maxBytes of JSON (at least
// one), and the cursor of the next chunk: the same page after the last id
// returned, or the start of the next page. An id added to a page while it
// is being listed may be missed if it sorts before the cursor (its create
// started its workflow); an id removed never shifts the others. Page 0
// from its start moves the one-key index of earlier versions onto the
// pages first (WorkerIDsPage).
func (c *Catalog) WorkerIDsChunk(ctx context.Context, cur IndexCursor, maxBytes int) (IndexChunk, error) {
	if cur.Done() {
		return IndexChunk{Next: cur}, nil
	}
	ids, err := c.WorkerIDsPage(ctx, cur.Page)
	if err != nil {
		return IndexChunk{}, err
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	i, found := slices.BinarySearch(ids, cur.After)
	if found {
		i++
	}
	out := IndexChunk{Next: IndexCursor{Page: cur.Page + 1}}
	size := 2 // []
	for ; i < len(ids); i++ {
		q, err := json.Marshal(ids[i])
		if err != nil {
			return IndexChunk{}, err
		}
		n := len(q) + 1 // and a comma
		if len(out.IDs) > 0 && size+n > maxBytes {
			out.Next = IndexCursor{Page: cur.Page, After: out.IDs[len(out.IDs)-1]}
			break
		}
		out.IDs = append(out.IDs, ids[i])
		size += n
	}
	return out, nil
}
