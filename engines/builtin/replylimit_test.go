package builtin

import (
	"testing"

	"github.com/virtufin/workmanager/engines"
)

// Issue 32 item 4 (wiring): the node's output limits (MAX_OUTPUTS_PER_MESSAGE,
// MAX_OUTPUT_BYTES, passed by cmd/worker as Config.MaxOutputs and
// MaxOutputBytes) reach every engine as its reply limit, read while a
// reply is read; unset, the dispatcher's defaults (100 outputs of 1 MiB).
func TestEveryEngineGetsTheNodesReplyLimit(t *testing.T) {
	for _, c := range []struct {
		outputs, bytes int
		want           int
	}{
		{0, 0, engines.ReplyLimit(100, 1<<20)},
		{3, 1000, engines.ReplyLimit(3, 1000)},
		{100, 64 << 10, engines.ReplyLimit(100, 64<<10)},
	} {
		cfg := Config{MaxOutputs: c.outputs, MaxOutputBytes: c.bytes}
		for name, got := range map[string]int{
			"python": pythonConfig(cfg).MaxReplyBytes,
			"native": nativeConfig(cfg).MaxReplyBytes,
			"dotnet": dotnetConfig(cfg).MaxReplyBytes,
		} {
			if got != c.want {
				t.Errorf("%s with MaxOutputs %d, MaxOutputBytes %d: MaxReplyBytes %d; want %d", name, c.outputs, c.bytes, got, c.want)
			}
		}
	}
	if engines.ReplyLimit(3, 1000) >= engines.DefaultMaxReplyBytes {
		t.Fatal("the test's small limits are not smaller than the default")
	}
}
