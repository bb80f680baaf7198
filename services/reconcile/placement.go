package reconcile

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/virtufin/workmanager/internal/node"
	"github.com/virtufin/workmanager/internal/placement"
)

// Placed is this node's side of placement (issue 45): its view of the
// record (placement.Follower) and the node that follows it. It is what the
// placement activities run on this node (activities.PlacedNode), and it
// converges the node by itself whenever its view changes (Run), so that a
// node the placement workflow could not reach still follows the record.
type Placed struct {
	Follower *placement.Follower
	Node     *node.Node
	Log      *slog.Logger
	// SubscribeWait bounds how long Converge waits for the subscriptions
	// of the topics it gained (0: 30 s).
	SubscribeWait time.Duration
	// MinGap is the least time between two convergences Run starts on
	// its own (0: DefaultConvergeGap). A convergence reads the catalog's
	// index and the records of the workers not attached here, and every
	// create on a new topic changes the record: without a gap a burst of
	// creates read them once a create. The placement workflow's own calls (Converge) never wait:
	// what Run does is the fallback for a node the workflow did not
	// reach, and a create's Apply attaches its worker itself.
	MinGap time.Duration

	kick chan struct{}
	once sync.Once
	mu   sync.Mutex // one convergence at a time
}

func (p *Placed) init() { p.once.Do(func() { p.kick = make(chan struct{}, 1) }) }

// Changed asks for a convergence (the follower's OnChange): it never blocks.
func (p *Placed) Changed() {
	p.init()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Refresh reads the placement record again.
func (p *Placed) Refresh(ctx context.Context) (bool, error) { return p.Follower.Refresh(ctx) }

// Observe takes a record this node read or wrote as its view when it is
// newer (placement.Follower.Observe).
func (p *Placed) Observe(r placement.Record) bool { return p.Follower.Observe(r) }

// Converge makes the node match its view of the record and waits until it
// holds a subscription to every topic it serves (or SubscribeWait passed);
// it returns the topics it serves.
func (p *Placed) Converge(ctx context.Context) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	res, err := p.Node.ConvergePlacement(ctx)
	if err != nil {
		return nil, err
	}
	wait := p.SubscribeWait
	if wait <= 0 {
		wait = 30 * time.Second
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if missing := p.Node.WaitSubscribed(wctx, res.Topics); len(missing) > 0 && p.Log != nil {
		p.Log.Warn("topics placed here are not subscribed yet", "topics", missing)
	}
	if res.Attached+res.Detached+res.Failed > 0 && p.Log != nil {
		p.Log.Info("placement converged", "attached", res.Attached, "detached", res.Detached, "failed", res.Failed, "topics", len(res.Topics))
	}
	return res.Topics, nil
}

// DefaultConvergeGap is Placed.MinGap's default.
const DefaultConvergeGap = time.Second

// Run converges the node every time its view of the record changes, at
// most once every MinGap (changes meanwhile make one convergence at the
// end of the gap), and refreshes that view every interval, until ctx
// ends.
func (p *Placed) Run(ctx context.Context, interval time.Duration) {
	p.init()
	go p.Follower.Run(ctx, interval)
	gap := p.MinGap
	if gap <= 0 {
		gap = DefaultConvergeGap
	}
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
		if wait := gap - time.Since(last); !last.IsZero() && wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			select { // changes during the wait are in this convergence
			case <-p.kick:
			default:
			}
		}
		last = time.Now()
		if _, err := p.Converge(ctx); err != nil && ctx.Err() == nil && p.Log != nil {
			p.Log.Warn("placement not converged; trying again at the next change", "err", err)
		}
	}
}

// Advertise writes this node's advertisement (placement.NodeInfo, built by
// info) now and every interval until ctx ends, so that the placement
// workflow knows its labels, the engines it runs and its load.
func Advertise(ctx context.Context, log *slog.Logger, s *placement.Store, info func() placement.NodeInfo, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		n := info()
		n.UpdatedAt = time.Now().UTC()
		if err := s.Advertise(ctx, n, 0); err != nil && ctx.Err() == nil {
			log.Warn("node advertisement not written", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
