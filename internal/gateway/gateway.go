// Package gateway owns how worker code reaches backend services: an
// engines.Gateway that calls them through Dapr service invocation (a Dapr app
// id or an HTTPEndpoint resource name), POSTing the request as JSON.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	dapr "github.com/dapr/go-sdk/client"
)

// Dapr is an engines.Gateway over Dapr service invocation.
type Dapr struct {
	client  dapr.Client
	timeout time.Duration
}

// NewDapr calls services through client; each call is bounded by timeout
// (0: 30s).
func NewDapr(client dapr.Client, timeout time.Duration) *Dapr {
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	return &Dapr{client: client, timeout: timeout}
}

// Call implements engines.Gateway.
func (d *Dapr) Call(ctx context.Context, service, method string, request []byte) ([]byte, error) {
	if service == "" || method == "" {
		return nil, errors.New("gateway: service and method are required")
	}
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	resp, err := d.client.InvokeMethodWithContent(ctx, service, method, "post",
		&dapr.DataContent{ContentType: "application/json", Data: request})
	if err != nil {
		return nil, fmt.Errorf("gateway: %s/%s: %w", service, method, err)
	}
	return resp, nil
}
