package redischeck

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/health"
)

// fakeRedis serves RESP on a loopback port: CONFIG GET answers from cfg
// (or with refuse as an error reply, when set); AUTH wants password.
func fakeRedis(t *testing.T, cfg map[string]string, refuse, password string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				r := bufio.NewReader(c)
				authed := password == ""
				for {
					v, err := readReply(r, 0)
					if err != nil {
						return
					}
					a, _ := v.([]any)
					args := make([]string, len(a))
					for i := range a {
						args[i], _ = a[i].(string)
					}
					switch {
					case len(args) >= 2 && strings.EqualFold(args[0], "AUTH"):
						if args[len(args)-1] != password {
							fmt.Fprint(c, "-WRONGPASS invalid username-password pair\r\n")
							continue
						}
						authed = true
						fmt.Fprint(c, "+OK\r\n")
					case !authed:
						fmt.Fprint(c, "-NOAUTH Authentication required.\r\n")
					case len(args) == 3 && strings.EqualFold(args[0], "CONFIG") && refuse != "":
						fmt.Fprintf(c, "-%s\r\n", refuse)
					case len(args) == 3 && strings.EqualFold(args[0], "CONFIG"):
						val := cfg[args[2]]
						fmt.Fprintf(c, "*2\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", len(args[2]), args[2], len(val), val)
					default:
						fmt.Fprint(c, "-ERR unknown command\r\n")
					}
				}
			}(c)
		}
	}()
	return ln.Addr().String()
}

func run(t *testing.T, s Settings) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return Run(ctx, s)
}

func TestVerdicts(t *testing.T) {
	good := map[string]string{"maxmemory-policy": "noeviction", "appendonly": "yes", "appendfsync": "everysec", "save": ""}
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for a, b := range good {
			m[a] = b
		}
		m[k] = v
		return m
	}
	for name, c := range map[string]struct {
		cfg     map[string]string
		refuse  string
		status  health.Status
		checked bool
		want    []string
	}{
		"noeviction and AOF": {cfg: good, status: health.Healthy, checked: true, want: []string{"noeviction", "appendonly yes"}},
		"allkeys-lru":        {cfg: with("maxmemory-policy", "allkeys-lru"), status: health.Degraded, checked: true, want: []string{`maxmemory-policy is "allkeys-lru"`, "delivery records", "set maxmemory-policy noeviction"}},
		"volatile-ttl":       {cfg: with("maxmemory-policy", "volatile-ttl"), status: health.Degraded, checked: true, want: []string{`"volatile-ttl"`}},
		"no persistence":     {cfg: with("appendonly", "no"), status: health.Degraded, checked: true, want: []string{"no persistence", "set appendonly yes"}},
		"RDB only":           {cfg: map[string]string{"maxmemory-policy": "noeviction", "appendonly": "no", "save": "3600 1"}, status: health.Degraded, checked: true, want: []string{"RDB snapshots only"}},
		"appendfsync no":     {cfg: with("appendfsync", "no"), status: health.Degraded, checked: true, want: []string{"appendfsync is no"}},
		"CONFIG refused":     {refuse: "ERR unknown command 'CONFIG', with args beginning with: 'GET'", status: health.Healthy, want: []string{"warning: not checked", "CONFIG GET maxmemory-policy refused", "unknown command"}},
		"CONFIG not allowed": {refuse: "NOPERM User default has no permissions to run the 'config|get' command", status: health.Healthy, want: []string{"not checked", "NOPERM"}},
	} {
		t.Run(name, func(t *testing.T) {
			r := run(t, Settings{Addr: fakeRedis(t, c.cfg, c.refuse, "")})
			if r.Status != c.status || r.Checked != c.checked {
				t.Fatalf("got %s (checked %v): %s; want %s (checked %v)", r.Status, r.Checked, r.Detail, c.status, c.checked)
			}
			for _, w := range c.want {
				if !strings.Contains(r.Detail, w) {
					t.Errorf("detail %q lacks %q", r.Detail, w)
				}
			}
		})
	}
}

func TestAuthAndUnset(t *testing.T) {
	good := map[string]string{"maxmemory-policy": "noeviction", "appendonly": "yes", "appendfsync": "always"}
	addr := fakeRedis(t, good, "", "s3cret-pw")
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("s3cret-pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := run(t, Settings{Addr: addr, Username: "workmanager-check", PasswordFile: pw}); r.Status != health.Healthy || !r.Checked {
		t.Fatalf("with the password: %+v", r)
	}
	if r := run(t, Settings{Addr: addr}); r.Checked || !strings.Contains(r.Detail, "NOAUTH") {
		t.Fatalf("without the password: %+v", r)
	}
	wrong := filepath.Join(t.TempDir(), "wrong")
	_ = os.WriteFile(wrong, []byte("nope"), 0o600)
	if r := run(t, Settings{Addr: addr, PasswordFile: wrong}); r.Checked || !strings.Contains(r.Detail, "WRONGPASS") || strings.Contains(r.Detail, "nope") {
		t.Fatalf("wrong password: %+v", r)
	}
	if r := run(t, Settings{}); r.Status != health.Healthy || !strings.Contains(r.Detail, "REDIS_CHECK_ADDR is unset") {
		t.Fatalf("unset: %+v", r)
	}
}

// Watch reports into the health state.
func TestWatchReports(t *testing.T) {
	addr := fakeRedis(t, map[string]string{"maxmemory-policy": "allkeys-lru", "appendonly": "yes", "appendfsync": "everysec"}, "", "")
	hs := health.NewEmpty()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Watch(ctx, slogDiscard(), Settings{Addr: addr}, hs, time.Hour)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, ok := hs.Report().Checks[Check]; ok {
			if c.Status != health.Degraded || !strings.Contains(c.Detail, "allkeys-lru") {
				t.Fatalf("got %+v", c)
			}
			if hs.Report().Status != health.Degraded {
				t.Fatalf("overall %s", hs.Report().Status)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no report after 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func slogDiscard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
