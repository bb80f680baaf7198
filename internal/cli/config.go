package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"gopkg.in/yaml.v3"
)

// Config is the resolved connection settings of one run.
type Config struct {
	Addr string
	// Token is the bearer token sent ("": none); TokenFrom says where it
	// came from (for messages and tests).
	Token, TokenFrom string
	TLS              bool
	CA, Cert, Key    string
	Timeout          time.Duration
	Dapr, Pubsub     string
	// DaprToken is daprd's API token (DAPR_API_TOKEN), sent to daprd.
	DaprToken string
}

// fileConfig is the config file (keys as documented in cmd/wmctl/README.md).
type fileConfig struct {
	Addr      string `yaml:"addr"`
	Token     string `yaml:"token"`
	TokenFile string `yaml:"token_file"`
	TLS       *bool  `yaml:"tls"`
	CA        string `yaml:"ca"`
	Cert      string `yaml:"cert"`
	Key       string `yaml:"key"`
	Dapr      string `yaml:"dapr"`
}

// DevTokenFile is the token file used when no token is configured, relative
// to the working directory: what `make run` writes.
const DevTokenFile = ".run/dev-token"

// configPath is the config file to read and whether it must exist.
func (a *app) configPath(fs *pflag.FlagSet) (string, bool) {
	if flagChanged(fs, "config") {
		v, _ := fs.GetString("config")
		return v, true
	}
	if v := a.opts.Getenv("WMCTL_CONFIG"); v != "" {
		return v, true
	}
	if x := a.opts.Getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "wmctl", "config.yaml"), false
	}
	if h := a.opts.Getenv("HOME"); h != "" {
		return filepath.Join(h, ".config", "wmctl", "config.yaml"), false
	}
	return "", false
}

// readConfigFile reads path; paths in it are relative to its folder.
func readConfigFile(path string, required bool) (fileConfig, error) {
	var fc fileConfig
	if path == "" {
		return fc, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && !required {
		return fc, nil
	}
	if err != nil {
		return fc, fmt.Errorf("config file: %w", err)
	}
	if err := checkConfigKeys(path, b); err != nil {
		return fc, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&fc); err != nil && !errors.Is(err, io.EOF) {
		return fc, fmt.Errorf("config file %s: %v", path, err)
	}
	dir := filepath.Dir(path)
	for _, p := range []*string{&fc.TokenFile, &fc.CA, &fc.Cert, &fc.Key} {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
	return fc, nil
}

// configKeys are the keys of the config file, in the order of fileConfig.
var configKeys = func() []string {
	t := reflect.TypeOf(fileConfig{})
	keys := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		keys = append(keys, strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0])
	}
	return keys
}()

// checkConfigKeys refuses a key of the config file's top-level mapping
// that is not one of configKeys, naming its line and the valid keys (the
// YAML decoder's own message names only the Go type).
func checkConfigKeys(path string, b []byte) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return nil // the decoder reports what is wrong
	}
	m := doc.Content[0]
	for i := 0; i+1 < len(m.Content); i += 2 {
		k := m.Content[i]
		if !slices.Contains(configKeys, k.Value) {
			return fmt.Errorf("config file %s: line %d: unknown key %q (valid keys: %s)", path, k.Line, k.Value, strings.Join(configKeys, ", "))
		}
	}
	return nil
}

// loadConfig resolves a.cfg: flag > environment > config file > default.
func (a *app) loadConfig(fs *pflag.FlagSet) error {
	path, required := a.configPath(fs)
	fc, err := readConfigFile(path, required)
	if err != nil {
		return usageErr(err)
	}
	cfg, err := resolve(fs, a.opts.Getenv, fc, a.opts.WorkDir)
	if err != nil {
		return usageErr(err)
	}
	a.cfg = cfg
	return nil
}

// resolve applies the precedence flag > env > file > default.
func resolve(fs *pflag.FlagSet, getenv func(string) string, fc fileConfig, workDir string) (Config, error) {
	pick := func(flag, env, file, def string) string {
		if flagChanged(fs, flag) {
			v, _ := fs.GetString(flag)
			return v
		}
		if v := getenv(env); v != "" {
			return v
		}
		if file != "" {
			return file
		}
		return def
	}
	c := Config{
		Addr:      pick("addr", "WMCTL_ADDR", fc.Addr, defaultAddr),
		CA:        pick("ca", "WMCTL_CA", fc.CA, ""),
		Cert:      pick("cert", "WMCTL_CERT", fc.Cert, ""),
		Key:       pick("key", "WMCTL_KEY", fc.Key, ""),
		Dapr:      pick("dapr", "DAPR_GRPC_ADDRESS", fc.Dapr, defaultDapr),
		Pubsub:    pick("pubsub", "DAPR_PUBSUB", "", defaultPubsub),
		DaprToken: getenv("DAPR_API_TOKEN"),
	}
	c.Timeout, _ = fs.GetDuration("timeout")
	if c.Timeout <= 0 {
		return c, errors.New("--timeout must be positive")
	}
	switch {
	case flagChanged(fs, "tls"):
		c.TLS, _ = fs.GetBool("tls")
	case getenv("WMCTL_TLS") != "":
		v, err := strconv.ParseBool(getenv("WMCTL_TLS"))
		if err != nil {
			return c, fmt.Errorf("WMCTL_TLS: %q is not a boolean", getenv("WMCTL_TLS"))
		}
		c.TLS = v
	case fc.TLS != nil:
		c.TLS = *fc.TLS
	}
	if c.CA != "" || c.Cert != "" || c.Key != "" {
		c.TLS = true
	}
	if (c.Cert == "") != (c.Key == "") {
		return c, errors.New("a client certificate needs both --cert and --key")
	}

	// The credential: the first level that names a token or a token file.
	flagToken, flagFile := "", ""
	if flagChanged(fs, "token") {
		flagToken, _ = fs.GetString("token")
		if flagToken == "" {
			return c, errors.New("--token is empty")
		}
	}
	if flagChanged(fs, "token-file") {
		flagFile, _ = fs.GetString("token-file")
		if flagFile == "" {
			return c, errors.New("--token-file is empty")
		}
	}
	levels := []struct{ token, file, tokenFrom, fileFrom string }{
		{flagToken, flagFile, "--token", "--token-file"},
		{getenv("WMCTL_TOKEN"), getenv("WMCTL_TOKEN_FILE"), "WMCTL_TOKEN", "WMCTL_TOKEN_FILE"},
		{fc.Token, fc.TokenFile, "config token", "config token_file"},
	}
	for _, l := range levels {
		if l.token == "" && l.file == "" {
			continue
		}
		if l.token != "" && l.file != "" {
			return c, fmt.Errorf("both %s and %s are set: use one", l.tokenFrom, l.fileFrom)
		}
		if l.token != "" {
			c.Token, c.TokenFrom = strings.TrimSpace(l.token), l.tokenFrom
			return c, nil
		}
		tok, err := readToken(l.file)
		if err != nil {
			return c, fmt.Errorf("%s: %v", l.fileFrom, err)
		}
		c.Token, c.TokenFrom = tok, l.file
		return c, nil
	}
	dev := filepath.Join(workDir, DevTokenFile)
	if _, err := os.Stat(dev); err == nil {
		tok, err := readToken(dev)
		if err != nil {
			return c, err
		}
		c.Token, c.TokenFrom = tok, dev
	}
	return c, nil
}

func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	return tok, nil
}

// dial opens the client connection to the API (lazily: nothing is sent
// before the first call).
func dial(c Config) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if c.TLS {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.CA != "" {
			pem, err := os.ReadFile(c.CA)
			if err != nil {
				return nil, usageErr(fmt.Errorf("--ca: %w", err))
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, usageErr(fmt.Errorf("--ca: no PEM certificate in %s", c.CA))
			}
			tc.RootCAs = pool
		}
		if c.Cert != "" {
			pair, err := tls.LoadX509KeyPair(c.Cert, c.Key)
			if err != nil {
				return nil, usageErr(fmt.Errorf("--cert/--key: %w", err))
			}
			tc.Certificates = []tls.Certificate{pair}
		}
		creds = credentials.NewTLS(tc)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds), grpc.WithUserAgent("wmctl")}
	if c.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(c.Token)))
	}
	conn, err := grpc.NewClient(c.Addr, opts...)
	if err != nil {
		return nil, usageErr(fmt.Errorf("--addr %q: %w", c.Addr, err))
	}
	return conn, nil
}

// bearer sends "authorization: Bearer <token>" on every call, also over
// plaintext (the dev stack on loopback).
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }
