package childproc

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines/internal/wire"
)

// A process that dies before its hello is said to have died, not to have
// been waited for until the timeout; one that says nothing in time is said
// to have timed out.
func TestAwaitHelloSaysWhatHappened(t *testing.T) {
	newProc := func() *Proc {
		p := &Proc{exited: true} // Kill does nothing: no real process
		p.timer = time.AfterFunc(time.Hour, p.onTimeout)
		p.timer.Stop()
		return p
	}
	err := newProc().AwaitHello(func() (byte, []byte, error) { return 0, nil, ErrGone }, time.Minute)
	if !errors.Is(err, ErrGone) || strings.Contains(err.Error(), "within") {
		t.Fatalf("died at once: %v, want ErrGone without a timeout", err)
	}
	p := newProc()
	err = p.AwaitHello(func() (byte, []byte, error) {
		for !p.TimedOut() {
			time.Sleep(time.Millisecond) // the timeout marks it; a real read would then see EOF
		}
		return 0, nil, ErrGone
	}, 20*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "no hello within 20ms") {
		t.Fatalf("silent: %v, want no hello within 20ms", err)
	}
	if err := newProc().AwaitHello(func() (byte, []byte, error) { return wire.KindHello, nil, nil }, time.Minute); err != nil {
		t.Fatalf("hello: %v", err)
	}
}
