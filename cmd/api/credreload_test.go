package main

import (
	"strings"
	"testing"
	"time"
)

// CREDENTIALS_RELOAD_INTERVAL (30s by default, 0 off) reaches both the
// API's own credentials and the Temporal client's; a negative one stops
// the start.
func TestCredentialsReloadInterval(t *testing.T) {
	t.Setenv("API_TOKENS_FILE", "/etc/workmanager/api-tokens")
	for v, want := range map[string]time.Duration{"": 30 * time.Second, "5s": 5 * time.Second, "0": 0} {
		t.Setenv("CREDENTIALS_RELOAD_INTERVAL", v)
		c, err := loadConfig()
		if err != nil || c.Auth.ReloadInterval != want || c.Temporal.ReloadInterval != want {
			t.Fatalf("%q: auth %s, temporal %s, %v; want %s", v, c.Auth.ReloadInterval, c.Temporal.ReloadInterval, err, want)
		}
	}
	t.Setenv("CREDENTIALS_RELOAD_INTERVAL", "-1s")
	if _, err := loadConfig(); err == nil || !strings.Contains(err.Error(), "CREDENTIALS_RELOAD_INTERVAL must not be negative") {
		t.Fatalf("a negative interval: %v", err)
	}
}
