package python

import (
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines/internal/wire"
)

func BenchmarkGoSideCodec(b *testing.B) {
	ev := event.New()
	ev.SetID("bench-1")
	ev.SetSource("/bench")
	ev.SetType("bench.request")
	ev.SetExtension("correlationid", "corr-bench")
	ev.SetData(event.ApplicationJSON, map[string]string{"payload": strings.Repeat("x", 1010)})
	var fb frameBuf
	reply := []byte(`{"type":"bench.echo","data":{"payload":"` + strings.Repeat("x", 1010) + `"},"correlationid":"corr-bench","specversion":"1.0","datacontenttype":"application/json"}`)
	b.ReportAllocs()
	for b.Loop() {
		fb.reset(kindEvent)
		if err := event.WriteJson(&ev, &fb); err != nil {
			b.Fatal(err)
		}
		out, err := wire.DecodeOutputs(reply, 0)
		if err != nil || len(out) != 1 {
			b.Fatal(err)
		}
	}
}
