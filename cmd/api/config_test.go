package main

import (
	"strings"
	"testing"
	"time"
)

func TestConfigDefaults(t *testing.T) {
	t.Setenv("API_TOKENS_FILE", "/etc/workmanager/api-tokens")
	t.Setenv("DAPR_PUBSUB", "") // empty: unset
	t.Setenv("DELIVERY_RECORD_TTL", "")
	c, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if c.PubSub != "pubsub" || c.DeliveryRecordTTL != 24*time.Hour || c.Auth.Off || c.Auth.PublicHealth || c.StreamMaxLen != 1000000 {
		t.Fatalf("defaults: pubsub %q, delivery record TTL %s", c.PubSub, c.DeliveryRecordTTL)
	}
	t.Setenv("DAPR_PUBSUB", "events")
	t.Setenv("DELIVERY_RECORD_TTL", "2h")
	if c, err = loadConfig(); err != nil || c.PubSub != "events" || c.DeliveryRecordTTL != 2*time.Hour {
		t.Fatalf("from the environment: %+v %v", c, err)
	}
}

func TestConfigRejectsBadValues(t *testing.T) {
	t.Setenv("API_TOKENS_FILE", "/etc/workmanager/api-tokens")
	for env, want := range map[string]string{
		"API_AUTH=maybe":                    `API_AUTH must be "on" or "off"`,
		"API_TLS_CERT_FILE=/tls/cert.pem":   "API_TLS_CERT_FILE and API_TLS_KEY_FILE go together",
		"API_CLIENT_CA_FILE=/tls/ca.pem":    "API_CLIENT_CA_FILE (client certificates) needs server TLS",
		"API_TOKENS_FILE=":                  "authentication is on (API_AUTH) but no method is configured",
		"DELIVERY_RECORD_TTL=soon":          `DELIVERY_RECORD_TTL="soon"`,
		"DELIVERY_RECORD_TTL=-1h":           "DELIVERY_RECORD_TTL must be at least 1m",
		"DELIVERY_RECORD_TTL=30s":           "DELIVERY_RECORD_TTL must be at least 1m",
		"STREAM_MAX_LEN=5":                  "STREAM_MAX_LEN must be 0 (the pub/sub component's maxLenApprox applies) or at least 10000",
		"TEMPORAL_TLS=maybe":                `TEMPORAL_TLS="maybe"`,
		"TEMPORAL_API_KEY_FILE=/k":          "TEMPORAL_API_KEY_FILE is set but TEMPORAL_TLS is not true",
		"QUOTA_WORKERS_PER_TENANT=-1":       "QUOTA_WORKERS_PER_TENANT, QUOTA_WORKERS_TOTAL, QUOTA_MEMORY_PER_TENANT_BYTES and QUOTA_MEMORY_TOTAL_BYTES must be 0 (unlimited) or positive",
		"QUOTA_WORKER_MEMORY=text/x-python": `QUOTA_WORKER_MEMORY: "text/x-python" is not mime_type=bytes`,
		"REDIS_CHECK_TLS=maybe":             `REDIS_CHECK_TLS="maybe"`,
	} {
		t.Run(env, func(t *testing.T) {
			k, v, _ := strings.Cut(env, "=")
			t.Setenv(k, v)
			if _, err := loadConfig(); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("got %v, want %q", err, want)
			}
		})
	}
}
