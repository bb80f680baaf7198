package validate

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// Issue 46 item 6: the pub/sub may run on a Redis of its own (the
// broker), with credentials of its own, and producers get ACL users on it
// confined to their input streams (docs/scaling.md, "A broker Redis of its
// own, and producers").

// TestSeparateBrokerRedis: a build whose Component pubsub points at
// another Redis than the state store passes every check, and its
// credentials are Secret keys of their own.
func TestSeparateBrokerRedis(t *testing.T) {
	b, err := LoadBuild(root, ".")
	if err != nil {
		t.Fatal(err)
	}
	var ps, store *DaprComponent
	for _, d := range b.Find("Component") {
		switch c := d.Obj.(*DaprComponent); c.Metadata.Name {
		case "pubsub":
			ps = c
		case "statestore":
			store = c
		}
	}
	if ps == nil || store == nil {
		t.Fatal("the build needs the Components pubsub and statestore")
	}
	for i := range ps.Spec.Metadata {
		if ps.Spec.Metadata[i].Name == "redisHost" {
			v := "broker-redis-master.redis:6379"
			ps.Spec.Metadata[i].Value = &v
		}
	}
	key := func(c *DaprComponent, name string) string {
		m, ok := c.Meta(name)
		if !ok || m.SecretKeyRef == nil {
			return ""
		}
		return m.SecretKeyRef.Name + "/" + m.SecretKeyRef.Key
	}
	if k := key(ps, "redisPassword"); k == "" || k == key(store, "redisPassword") {
		t.Errorf("the pub/sub's redisPassword (%q) must be a Secret key of its own, not the state store's (%q)", k, key(store, "redisPassword"))
	}
	if key(ps, "redisUsername") == "" {
		t.Errorf("the pub/sub needs a redisUsername from a Secret (an ACL user on a broker of its own)")
	}
	nodeReads, apiReads := reads(t)
	(&checker{t: t, b: b, secrets: exampleSecrets(t)}).run("pubsub.redis", nodeReads, apiReads)
}

// aclUser is one ACL SETUSER line of the docs.
type aclUser struct {
	name, password string
	keys           []string
	commands       []string // +cmd, +cmd|sub, +@category, in order
	line           string
}

// brokerACL reads the lines of the block after <!-- broker-acl --> in
// docs/scaling.md.
func brokerACL(t *testing.T) []aclUser {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, "docs", "scaling.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- broker-acl -->\\s*```[a-z]*\\n(.*?)\\n\\s*```").FindSubmatch(b)
	if m == nil {
		t.Fatal("docs/scaling.md: no <!-- broker-acl --> block")
	}
	var out []aclUser
	for _, line := range strings.Split(string(m[1]), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) < 3 || f[0] != "ACL" || f[1] != "SETUSER" {
			t.Fatalf("docs/scaling.md broker-acl: %q is not an ACL SETUSER line", line)
		}
		u := aclUser{name: f[2], line: strings.TrimSpace(line)}
		for _, r := range f[3:] {
			switch {
			case r == "on" || r == "off" || r == "resetkeys" || r == "resetchannels":
			case strings.HasPrefix(r, ">"):
				u.password = r[1:]
			case strings.HasPrefix(r, "~"):
				u.keys = append(u.keys, r[1:])
			case r == "-@all" || strings.HasPrefix(r, "+"):
				u.commands = append(u.commands, r)
			default:
				t.Errorf("docs/scaling.md broker-acl: %s: rule %q is not one this test knows (on, off, >password, resetkeys, ~key, resetchannels, -@all, +command)", u.name, r)
			}
		}
		out = append(out, u)
	}
	return out
}

// reservedSamples are stream keys no producer or consumer may reach.
var reservedSamples = []string{"workmanager.lifecycle", "workmanager.probe", "workmanager.x", "orders-dead", "order.priced-dead", "payments-dead"}

// globMatch is Redis' glob (stringmatchlen): * ? [...] and \ escapes.
func globMatch(p, s string) bool {
	for len(p) > 0 {
		switch p[0] {
		case '*':
			for i := 0; i <= len(s); i++ {
				if globMatch(p[1:], s[i:]) {
					return true
				}
			}
			return false
		case '?':
			if s == "" {
				return false
			}
		case '[':
			end := strings.IndexByte(p, ']')
			if end < 0 || s == "" || !strings.ContainsRune(p[1:end], rune(s[0])) {
				return false
			}
			p, s = p[end+1:], s[1:]
			continue
		case '\\':
			if len(p) > 1 {
				p = p[1:]
			}
			fallthrough
		default:
			if s == "" || s[0] != p[0] {
				return false
			}
		}
		p, s = p[1:], s[1:]
	}
	return s == ""
}

// publisherCommands are the Redis commands daprd's Redis streams component
// sends as a publisher: read from its Init and Publish.
func publisherCommands(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, "deploy", "dapr", "daprd", "redisstreams", "redis.go"))
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	body := func(fn string) string {
		i := strings.Index(src, "func (r *redisStreams) "+fn+"(")
		if i < 0 {
			t.Fatalf("redisstreams/redis.go: no %s: update this test", fn)
		}
		j := strings.Index(src[i+1:], "\nfunc ")
		return src[i : i+1+j]
	}
	names := map[string]string{"PingResult": "ping", "XAdd": "xadd"}
	var out []string
	for _, fn := range []string{"Init", "Publish"} {
		for _, m := range regexp.MustCompile(`r\.client\.([A-Za-z]+)\(`).FindAllStringSubmatch(body(fn), -1) {
			cmd, ok := names[m[1]]
			if !ok {
				t.Fatalf("redisstreams/redis.go %s calls client.%s: add the Redis command it sends to this test and to the producers' ACL in docs/scaling.md", fn, m[1])
			}
			if !slices.Contains(out, cmd) {
				out = append(out, cmd)
			}
		}
	}
	return out
}

// TestBrokerACLExample: the docs' ACL lines confine every user but
// WorkManager's to named streams, none reserved; a producer may run
// exactly daprd's publisher's commands (and HELLO); and, with
// WM_TEST_REAL_REDIS=1 where redis-server is installed, the lines work on
// a real Redis.
func TestBrokerACLExample(t *testing.T) {
	users := brokerACL(t)
	pub := publisherCommands(t)
	producers := 0
	for _, u := range users {
		if u.name == "default" || u.name == "workmanager" {
			continue
		}
		if len(u.commands) == 0 || u.commands[0] != "-@all" {
			t.Errorf("%s: its command rules must start with -@all, got %v", u.name, u.commands)
		}
		for _, c := range u.commands[1:] {
			if strings.HasPrefix(c, "+@") {
				t.Errorf("%s: %s grants a whole category; name the commands", u.name, c)
			}
		}
		if len(u.keys) == 0 {
			t.Errorf("%s: no key pattern", u.name)
		}
		for _, k := range u.keys {
			if strings.ContainsAny(k, "*?[") {
				t.Errorf("%s: key pattern ~%s is a pattern: name each stream (a pattern such as orders* also matches orders-dead)", u.name, k)
			}
			for _, r := range reservedSamples {
				if globMatch(k, r) {
					t.Errorf("%s: ~%s reaches the reserved stream %s", u.name, k, r)
				}
			}
		}
		if strings.HasPrefix(u.name, "producer-") {
			producers++
			var got []string
			for _, c := range u.commands[1:] {
				got = append(got, strings.TrimPrefix(c, "+"))
			}
			want := append(slices.Clone(pub), "hello")
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("%s: commands %v, want what daprd's publisher sends (%v) and hello", u.name, got, want)
			}
		}
	}
	if producers == 0 {
		t.Fatal("docs/scaling.md broker-acl: no producer- user")
	}
	for _, want := range []string{"default", "workmanager"} {
		if !slices.ContainsFunc(users, func(u aclUser) bool { return u.name == want }) {
			t.Errorf("docs/scaling.md broker-acl: no line for user %s", want)
		}
	}
	t.Run("real redis", func(t *testing.T) { realRedisACL(t, users) })
}

// realRedisACL applies the lines to a redis-server of its own and checks
// what each producer may do.
func realRedisACL(t *testing.T, users []aclUser) {
	// Opt-in: it starts a server, which the validator's other checks never
	// do (and which must not run beside a soak of the shared machine).
	if os.Getenv("WM_TEST_REAL_REDIS") != "1" {
		t.Skip("set WM_TEST_REAL_REDIS=1 to apply the lines to a redis-server of its own")
	}
	server, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed")
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Skip("redis-cli not installed")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := exec.CommandContext(ctx, server, "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	run := func(user, pass string, args ...string) (string, error) {
		a := []string{"-h", "127.0.0.1", "-p", port, "--no-auth-warning"}
		if user != "" {
			a = append(a, "--user", user, "--pass", pass)
		}
		out, err := exec.CommandContext(ctx, cli, append(a, args...)...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	for {
		if out, err := run("", "", "PING"); err == nil && out == "PONG" {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("redis-server did not answer PING")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, u := range users {
		if out, err := run("", "", strings.Fields(u.line)...); err != nil || out != "OK" {
			t.Fatalf("%q: %s %v", u.line, out, err)
		}
	}
	for _, u := range users {
		if !strings.HasPrefix(u.name, "producer-") {
			continue
		}
		if out, _ := run(u.name, u.password, "PING"); out != "PONG" {
			t.Errorf("%s: PING: %s", u.name, out)
		}
		for _, k := range u.keys {
			if out, _ := run(u.name, u.password, "XADD", k, "MAXLEN", "~", "1000", "*", "data", "x"); strings.Contains(out, "NOPERM") || strings.Contains(out, "ERR") {
				t.Errorf("%s: XADD %s: %s", u.name, k, out)
			}
			if out, _ := run(u.name, u.password, "XREADGROUP", "GROUP", "g", "c", "STREAMS", k, ">"); !strings.Contains(out, "NOPERM") {
				t.Errorf("%s: XREADGROUP %s was not refused: %s", u.name, k, out)
			}
		}
		for _, r := range reservedSamples {
			if out, _ := run(u.name, u.password, "XADD", r, "*", "data", "forged"); !strings.Contains(out, "NOPERM") {
				t.Errorf("%s: XADD %s was not refused: %s", u.name, r, out)
			}
		}
		if out, _ := run(u.name, u.password, "GET", "workmanager/worker/x"); !strings.Contains(out, "NOPERM") {
			t.Errorf("%s: GET of a state key was not refused: %s", u.name, out)
		}
	}
	if out, _ := run("", "", "PING"); out == "PONG" {
		t.Errorf("the default user still answers after ACL SETUSER default off")
	}
}
