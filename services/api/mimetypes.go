package api

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/virtufin/workmanager/internal/cluster"
	"github.com/virtufin/workmanager/internal/placement"
)

// mimeTypesTTL is how long CreateWorker keeps the MIME types the live
// nodes advertise before it reads them again.
const mimeTypesTTL = 5 * time.Second

// advertisedMIMETypes caches what the live nodes advertise.
type advertisedMIMETypes struct {
	mu   sync.Mutex
	at   time.Time
	list []string
}

// acceptedMIMETypes are the MIME types CreateWorker accepts: the
// built-in engines' (New's mimeTypes) and those some live node advertises
// (placement.NodeInfo.MIMETypes: every engine registered where the node
// is assembled, one outside engines/builtin included), read at most every
// mimeTypesTTL. Without a cluster store, or when it cannot be read, the
// built-in ones.
func (s *Server) acceptedMIMETypes(ctx context.Context) []string {
	if s.opts.Cluster == nil {
		return s.mimeTypes
	}
	a := &s.advertised
	a.mu.Lock()
	defer a.mu.Unlock()
	if time.Since(a.at) > mimeTypesTTL {
		if list, err := s.readAdvertisedMIMETypes(ctx); err == nil {
			a.list, a.at = list, time.Now()
		} else {
			s.log.Warn("the MIME types the nodes advertise are unavailable; accepting the built-in ones", "err", err)
		}
	}
	out := slices.Clone(s.mimeTypes)
	for _, m := range a.list {
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	slices.Sort(out)
	return out
}

// readAdvertisedMIMETypes reads the MIME types of the live nodes'
// advertisements.
func (s *Server) readAdvertisedMIMETypes(ctx context.Context) ([]string, error) {
	ttl := s.opts.NodeTTL
	if ttl <= 0 {
		ttl = DefaultNodeTTL
	}
	alive, err := cluster.New(s.opts.Cluster, "", ttl).Alive(ctx)
	if err != nil {
		return nil, err
	}
	infos, err := placement.NewStore(s.opts.Cluster).Nodes(ctx, alive)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range infos {
		for _, m := range n.MIMETypes {
			if !slices.Contains(out, m) {
				out = append(out, m)
			}
		}
	}
	return out, nil
}
