package chaos

import (
	"context"
	"math/rand"
	"time"
)

// Fault kinds the nemesis injects.
const (
	faultKill     = "kill9-node"
	faultPause    = "sigstop-node"
	faultDaprd    = "restart-daprd"
	faultRedis    = "restart-redis"
	faultTemporal = "restart-temporal"
)

var faultKinds = []string{faultKill, faultPause, faultDaprd, faultRedis, faultTemporal}

// planned is one fault of the schedule: at offset from the nemesis start,
// of kind on node index target, lasting down.
type planned struct {
	at     time.Duration
	kind   string
	target int
	down   time.Duration
}

// schedule draws the faults for a run of length d from seed: one fault
// every 15–35 s, the kinds dealt in shuffled rounds so that every kind
// comes up as often as the others. The same seed gives the same schedule.
func schedule(seed int64, d time.Duration, nodes int) []planned {
	rng := rand.New(rand.NewSource(seed))
	var out []planned
	var deck []string
	at := time.Duration(10+rng.Intn(10)) * time.Second
	for at < d {
		if len(deck) == 0 {
			deck = append([]string(nil), faultKinds...)
			rng.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
		}
		p := planned{at: at, kind: deck[0], target: rng.Intn(nodes)}
		deck = deck[1:]
		switch p.kind {
		case faultKill:
			p.down = time.Duration(2+rng.Intn(6)) * time.Second
		case faultPause: // longer than the group lock's max age
			p.down = lockMaxAge + time.Duration(2+rng.Intn(5))*time.Second
		case faultDaprd:
			p.down = time.Duration(1+rng.Intn(4)) * time.Second
		case faultRedis:
			p.down = time.Duration(1+rng.Intn(4)) * time.Second
		case faultTemporal:
			p.down = time.Duration(2+rng.Intn(5)) * time.Second
		}
		out = append(out, p)
		at += time.Duration(15+rng.Intn(21)) * time.Second
	}
	return out
}

// runNemesis injects the schedule one fault at a time (a fault starts no
// earlier than its time and after the previous one has been repaired).
func runNemesis(ctx context.Context, c *cluster, j *journal, plan []planned) {
	start := time.Now()
	for _, p := range plan {
		sleepCtx(ctx, time.Until(start.Add(p.at)))
		if ctx.Err() != nil {
			return
		}
		n := c.nodes[p.target]
		f := fault{Kind: p.kind, Start: time.Now()}
		// The fault is repaired even when the run ends meanwhile.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		var err error
		switch p.kind {
		case faultKill:
			f.Target = n.id
			err = c.killNode(ctx, n, p.down)
		case faultPause:
			f.Target = n.id
			c.pauseNode(ctx, n, p.down)
		case faultDaprd:
			f.Target = "daprd-" + n.id
			err = c.restartDaprd(ctx, n, p.down)
		case faultRedis:
			f.Target = "redis"
			err = c.restartRedis(ctx, p.down)
		case faultTemporal:
			f.Target = "temporal"
			err = c.restartTemporal(ctx, p.down)
		}
		cancel()
		f.End = time.Now()
		if err != nil {
			f.Err = err.Error()
		}
		j.mu.Lock()
		j.faults = append(j.faults, f)
		j.mu.Unlock()
		j.logf("%s nemesis: %s of %s for %s (repaired at %s) %s", j.rel(f.Start), f.Kind, f.Target, p.down, j.rel(f.End), f.Err)
	}
}
