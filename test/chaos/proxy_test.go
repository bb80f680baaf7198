package chaos

import (
	"io"
	"net"
	"sync"
	"time"
)

// proxy is a TCP proxy in front of one server (Redis, Temporal) for one
// node: the node (or its daprd) is given the proxy's address, and the
// nemesis cuts the node off by closing every connection through it and
// refusing new ones (accepted and closed at once) until it is reopened.
// The server itself stays up for everyone else.
type proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	cuts  int
}

func newProxy(target string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go p.serve()
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		go p.handle(c)
	}
}

func (p *proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	for _, c := range cs {
		delete(p.conns, c)
	}
	p.mu.Unlock()
}

func (p *proxy) handle(client net.Conn) {
	if !p.track(client) {
		client.Close()
		return
	}
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		p.untrack(client)
		client.Close()
		return
	}
	if !p.track(server) { // cut while dialling
		p.untrack(client)
		client.Close()
		server.Close()
		return
	}
	var once sync.Once
	done := func() {
		once.Do(func() {
			client.Close()
			server.Close()
			p.untrack(client, server)
		})
	}
	go func() { _, _ = io.Copy(server, client); done() }()
	_, _ = io.Copy(client, server)
	done()
}

// setCut cuts the node off (closing every open connection) or reconnects
// it.
func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	p.cut = cut
	var open []net.Conn
	if cut {
		p.cuts++
		for c := range p.conns {
			open = append(open, c)
		}
		p.conns = map[net.Conn]struct{}{}
	}
	p.mu.Unlock()
	for _, c := range open {
		c.Close()
	}
}

func (p *proxy) close() {
	p.ln.Close()
	p.setCut(true)
}
