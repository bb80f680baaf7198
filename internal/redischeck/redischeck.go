// Package redischeck checks, at start and now and then, that the Redis
// holding WorkManager's state (catalog, code blobs, delivery records) keeps
// what it is given: no eviction (maxmemory-policy noeviction) and
// persistence by AOF with appendfsync everysec or always. The state store is
// reached through daprd, whose state API cannot ask Redis for its
// configuration, so the check talks to Redis itself (REDIS_CHECK_ADDR) with
// a small dependency-free RESP client that sends CONFIG GET only. Its
// verdict goes into the health report (docs/scaling.md, "Redis: what
// WorkManager needs from it"): Degraded, with the reason and the fix, when
// Redis evicts or does not persist; a warning ("not checked: …", Healthy)
// when the check could not ask (CONFIG disabled or refused, as on many
// managed Redis services, or Redis unreachable from here).
package redischeck

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/virtufin/workmanager/internal/health"
)

// Check is the name of the health check.
const Check = "redis_config"

// Settings say where the Redis to check is; Addr "" turns the check off
// (reported as not checked).
type Settings struct {
	Addr         string // REDIS_CHECK_ADDR: host:port of the state store's Redis
	Username     string // REDIS_CHECK_USERNAME: ACL user (empty: the default user)
	PasswordFile string // REDIS_CHECK_PASSWORD_FILE: a file holding the password (empty: no AUTH)
	TLS          bool   // REDIS_CHECK_TLS: TLS with the system's roots, server name from Addr
}

// Result is the verdict of one check.
type Result struct {
	Status health.Status
	Detail string
	// Checked is false when the check could not ask Redis (Detail says
	// why): a warning, reported Healthy.
	Checked bool
}

// Run checks once and returns the verdict; it never fails: an error asking
// is a Result with Checked false.
func Run(ctx context.Context, s Settings) Result {
	if s.Addr == "" {
		return Result{Status: health.Healthy, Detail: "not checked: REDIS_CHECK_ADDR is unset (set it to the state store's Redis to check its eviction policy and persistence; docs/scaling.md)"}
	}
	cfg, err := readConfig(ctx, s)
	if err != nil {
		return Result{Status: health.Healthy, Detail: fmt.Sprintf("warning: not checked: %v; check by hand that maxmemory-policy is noeviction and appendonly yes with appendfsync everysec (docs/scaling.md, \"Redis\")", err)}
	}
	return Judge(cfg)
}

// Judge turns the configuration values Redis gave (maxmemory-policy,
// appendonly, appendfsync, save) into a verdict.
func Judge(cfg map[string]string) Result {
	var problems []string
	if p := cfg["maxmemory-policy"]; p != "noeviction" {
		problems = append(problems, fmt.Sprintf("maxmemory-policy is %q: when Redis is full it evicts keys, silently dropping delivery records (messages then run again), catalog records and code blobs; set maxmemory-policy noeviction (writes then fail loudly instead)", p))
	}
	switch {
	case cfg["appendonly"] != "yes" && cfg["save"] == "":
		problems = append(problems, "no persistence (appendonly no and no RDB save points): a Redis restart loses every worker, code blob and delivery record; set appendonly yes and appendfsync everysec")
	case cfg["appendonly"] != "yes":
		problems = append(problems, fmt.Sprintf("appendonly is no (RDB snapshots only, save %q): a Redis restart loses the writes since the last snapshot; set appendonly yes and appendfsync everysec", cfg["save"]))
	case cfg["appendfsync"] == "no":
		problems = append(problems, "appendfsync is no: the AOF is flushed when the OS decides (about 30 s); set appendfsync everysec or always")
	}
	if len(problems) > 0 {
		return Result{Status: health.Degraded, Detail: strings.Join(problems, "; ") + " (docs/scaling.md, \"Redis\")", Checked: true}
	}
	return Result{Status: health.Healthy, Detail: fmt.Sprintf("maxmemory-policy noeviction, appendonly yes, appendfsync %s", cfg["appendfsync"]), Checked: true}
}

// Watch checks now and then every interval until ctx ends, reporting into
// hs (and logging a change of verdict).
func Watch(ctx context.Context, log *slog.Logger, s Settings, hs *health.State, interval time.Duration) {
	last := ""
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		r := Run(cctx, s)
		cancel()
		if ctx.Err() != nil {
			return
		}
		hs.Set(Check, r.Status, r.Detail)
		if r.Detail != last {
			switch {
			case r.Status != health.Healthy:
				log.Error("the state store's Redis may lose data", "check", Check, "reason", r.Detail)
			case !r.Checked:
				log.Warn("the state store's Redis configuration was not checked", "check", Check, "reason", r.Detail)
			default:
				log.Info("the state store's Redis configuration", "check", Check, "detail", r.Detail)
			}
			last = r.Detail
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// Parameters is what readConfig asks CONFIG GET for, one at a time (Redis
// 6 takes one pattern per call).
var Parameters = []string{"maxmemory-policy", "appendonly", "appendfsync", "save"}

func readConfig(ctx context.Context, s Settings) (map[string]string, error) {
	var password string
	if s.PasswordFile != "" {
		b, err := os.ReadFile(s.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("REDIS_CHECK_PASSWORD_FILE: %w", err)
		}
		password = strings.TrimRight(string(b), "\r\n")
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	var conn net.Conn
	var err error
	if s.TLS {
		host, _, _ := net.SplitHostPort(s.Addr)
		conn, err = (&tls.Dialer{NetDialer: &d, Config: &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}}).DialContext(ctx, "tcp", s.Addr)
	} else {
		conn, err = d.DialContext(ctx, "tcp", s.Addr)
	}
	if err != nil {
		return nil, fmt.Errorf("REDIS_CHECK_ADDR %s: %w", s.Addr, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	} else {
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	}
	c := &client{w: conn, r: bufio.NewReader(conn)}
	if password != "" {
		args := []string{"AUTH", password}
		if s.Username != "" {
			args = []string{"AUTH", s.Username, password}
		}
		if _, err := c.do(args...); err != nil {
			return nil, fmt.Errorf("AUTH at %s: %w", s.Addr, err)
		}
	}
	out := map[string]string{}
	for _, p := range Parameters {
		v, err := c.do("CONFIG", "GET", p)
		if err != nil {
			return nil, fmt.Errorf("CONFIG GET %s refused by %s: %w", p, s.Addr, err)
		}
		a, ok := v.([]any)
		if !ok || len(a) != 2 {
			return nil, fmt.Errorf("CONFIG GET %s at %s: unexpected answer %v", p, s.Addr, v)
		}
		val, _ := a[1].(string)
		out[p] = val
	}
	return out, nil
}

// client speaks RESP2: commands as arrays of bulk strings, replies parsed
// with bounds on every length (a reply is small: CONFIG GET of one name).
type client struct {
	w io.Writer
	r *bufio.Reader
}

// ErrReply is a Redis error reply ("-ERR unknown command", "-NOPERM …").
type ErrReply string

func (e ErrReply) Error() string { return string(e) }

const (
	maxBulk  = 1 << 20
	maxArray = 1024
	maxDepth = 4
)

func (c *client) do(args ...string) (any, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(c.w, b.String()); err != nil {
		return nil, err
	}
	v, err := readReply(c.r, 0)
	if err != nil {
		return nil, err
	}
	if e, ok := v.(ErrReply); ok {
		return nil, e
	}
	return v, nil
}

func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if len(line) > maxBulk {
		return "", errors.New("RESP line too long")
	}
	return strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r"), nil
}

// readReply reads one reply: a string (simple or bulk; nil for a null
// bulk), an int64, an ErrReply, or a []any.
func readReply(r *bufio.Reader, depth int) (any, error) {
	if depth > maxDepth {
		return nil, errors.New("RESP reply nested too deep")
	}
	line, err := readLine(r)
	if err != nil {
		return nil, err
	}
	if line == "" {
		return nil, errors.New("empty RESP line")
	}
	body := line[1:]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return ErrReply(body), nil
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < -1 || n > maxBulk {
			return nil, fmt.Errorf("bad RESP bulk length %q", body)
		}
		if n == -1 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < -1 || n > maxArray {
			return nil, fmt.Errorf("bad RESP array length %q", body)
		}
		if n == -1 {
			return nil, nil
		}
		out := make([]any, 0, n)
		for range n {
			v, err := readReply(r, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	}
	return nil, fmt.Errorf("unknown RESP reply %q", line)
}
