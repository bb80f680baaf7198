package envconfig

import (
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestDefaultsValuesAndTheFirstError(t *testing.T) {
	r := FromMap(map[string]string{"A": "x", "N": "3", "D": "2s", "B": "true", "L": "debug", "EMPTY": "",
		"BAD_D": "soon", "BAD_N": "many"})
	if r.String("A", "d") != "x" || r.String("EMPTY", "d") != "d" || r.String("UNSET", "d") != "d" {
		t.Fatal("strings")
	}
	if r.Int("N", 1) != 3 || r.Duration("D", time.Second) != 2*time.Second || !r.Bool("B", false) || r.LogLevel("L") != slog.LevelDebug {
		t.Fatal("typed values")
	}
	if r.LogLevel("UNSET") != slog.LevelInfo || r.Err() != nil {
		t.Fatalf("defaults: %v", r.Err())
	}
	if r.Duration("BAD_D", time.Minute) != time.Minute {
		t.Fatal("a bad value yields the default")
	}
	_ = r.Int("BAD_N", 0)
	if err := r.Err(); err == nil || !strings.HasPrefix(err.Error(), `BAD_D="soon": `) {
		t.Fatalf("the first error names its variable: %v", err)
	}
}

// The Temporal transport settings are read with the servers' (issue 46
// item 5): plain gRPC unless set.
func TestServicesReadTheTemporalTransport(t *testing.T) {
	if s := FromMap(nil).Services(); s.Temporal.TLS || s.Temporal.APIKeyFile != "" {
		t.Fatalf("defaults: %+v", s.Temporal)
	}
	r := FromMap(map[string]string{"TEMPORAL_TLS": "true", "TEMPORAL_TLS_CA_FILE": "/ca", "TEMPORAL_TLS_CERT_FILE": "/c", "TEMPORAL_TLS_KEY_FILE": "/k",
		"TEMPORAL_TLS_SERVER_NAME": "frontend", "TEMPORAL_API_KEY_FILE": "/key"})
	s := r.Services()
	if r.Err() != nil || !s.Temporal.TLS || s.Temporal.CAFile != "/ca" || s.Temporal.CertFile != "/c" || s.Temporal.KeyFile != "/k" ||
		s.Temporal.ServerName != "frontend" || s.Temporal.APIKeyFile != "/key" {
		t.Fatalf("%+v %v", s.Temporal, r.Err())
	}
}
