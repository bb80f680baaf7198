package main

import (
	"strings"
	"testing"
	"time"
)

func TestConfigDefaultsAndBadValues(t *testing.T) {
	c, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if c.WorkerTimeout != 30*time.Second || c.MaxConcurrency != 8 || !c.RecoveryOnStart || c.BrokerProbe != 2*time.Second || c.BrokerReadyGrace != 15*time.Second {
		t.Fatalf("defaults: %+v", c)
	}
	for name, tc := range map[string]struct{ env, value, want string }{
		"unparsable": {"BROKER_PROBE_INTERVAL", "often", `BROKER_PROBE_INTERVAL="often"`},
		"zero probe": {"BROKER_PROBE_INTERVAL", "0s", "BROKER_PROBE_INTERVAL must be positive"},
		"negative":   {"BROKER_READY_GRACE", "-1s", "BROKER_READY_GRACE must not be negative"},
		"bad bool":   {"WORKER_RECOVERY_ON_START", "maybe", `WORKER_RECOVERY_ON_START="maybe"`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(tc.env, tc.value)
			if _, err := loadConfig(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

func TestSecretValues(t *testing.T) {
	got := secretValues([]string{"DAPR_API_TOKEN=tok-123456", "DB_PASSWORD=hunter22", "AWS_SECRET_ACCESS_KEY=abcdefgh", "SHORT_KEY=abc", "HOME=/root", "PATH=/usr/bin"})
	if strings.Join(got, ",") != "tok-123456,hunter22,abcdefgh" {
		t.Fatalf("secretValues = %v", got)
	}
}
