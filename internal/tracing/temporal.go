package tracing

import (
	temporalotel "go.temporal.io/sdk/contrib/opentelemetry"
	"go.temporal.io/sdk/interceptor"
)

// TemporalInterceptors are the Temporal client interceptors that trace
// workflows, updates and activities (the SDK's OpenTelemetry tracing
// interceptor, carrying the trace in Temporal headers with this
// propagator); nil when tracing is off. On a client they also apply to the
// workers made from it.
func (t *Tracing) TemporalInterceptors() ([]interceptor.ClientInterceptor, error) {
	if !t.On() {
		return nil, nil
	}
	i, err := temporalotel.NewTracingInterceptor(temporalotel.TracerOptions{
		Tracer:            t.Provider.Tracer("go.temporal.io/sdk"),
		TextMapPropagator: t.Propagator,
	})
	if err != nil {
		return nil, err
	}
	return []interceptor.ClientInterceptor{i}, nil
}
