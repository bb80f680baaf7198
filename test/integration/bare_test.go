package integration

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
	dapr "github.com/dapr/go-sdk/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/virtufin/workmanager/internal/devstack"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/publish"
)

// bareEnv, when set in the environment of this test binary, makes it the
// benchmark's bare subscriber instead of running tests:
// "<daprd gRPC address> <input topic> <output topic>".
const bareEnv = "WM_BENCH_BARE_SUBSCRIBER"

func TestMain(m *testing.M) {
	if spec := os.Getenv(bareEnv); spec != "" {
		if err := bareSubscriberMain(strings.Fields(spec)); err != nil {
			fmt.Fprintln(os.Stderr, "bare subscriber:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	stopSharedStack()
	sharedTemporal.stop()
	if err := turns.writeTimes(); err != nil {
		fmt.Fprintln(os.Stderr, "integration times:", err)
	}
	os.Exit(code)
}

// bareSubscriberMain runs the bare republisher as a process of its own (as
// a user would deploy one next to daprd) until SIGTERM; it prints "ready"
// once subscribed.
func bareSubscriberMain(args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("%s wants 3 fields, got %q", bareEnv, args)
	}
	conn, err := grpc.NewClient(args[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	wait, err := republish(ctx, conn, args[1], args[2])
	if err != nil {
		return err
	}
	fmt.Println("ready")
	<-ctx.Done()
	wait()
	return nil
}

// republish subscribes to in on the daprd behind conn and republishes each
// event to out with 8 messages in flight; the returned function waits for
// the messages in flight once ctx is done.
func republish(ctx context.Context, conn *grpc.ClientConn, in, out string) (func(), error) {
	sub := dispatch.DaprSubscriber{Client: runtimev1.NewDaprClient(conn)}
	ctx, cancel := context.WithCancel(ctx)
	st, err := sub.Subscribe(ctx, devstack.PubSubName, in)
	if err != nil {
		cancel()
		return nil, err
	}
	pub := publish.NewDapr(dapr.NewClientWithConnection(conn), devstack.PubSubName)
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	go func() {
		for {
			req, err := st.Recv()
			if err != nil {
				return
			}
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				var ev event.Event
				if err := dispatch.Decode(req, &ev); err != nil {
					_ = st.Ack(req.GetId(), dispatch.AckRetry)
					return
				}
				o := event.New(event.CloudEventsVersionV1)
				o.SetID(ev.ID() + "/bare")
				o.SetSource("bench/bare")
				o.SetType(out)
				_ = o.SetData(event.ApplicationJSON, ev.Data())
				status := dispatch.AckSuccess
				if pub.Publish(context.Background(), out, &o) != nil {
					status = dispatch.AckRetry
				}
				_ = st.Ack(req.GetId(), status)
			}()
		}
	}()
	return func() { wg.Wait(); st.Close(); cancel() }, nil
}

// bareProcess starts the bare republisher as its own process (this test
// binary again, see TestMain) and returns its pid and how to stop it.
func (e *env) bareProcess(b *testing.B, in, out string) (int, func()) {
	b.Helper()
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), bareEnv+"="+strings.Join([]string{e.stack.DaprGRPCAddr, in, out}, " "))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		ready <- sc.Scan() && sc.Text() == "ready"
		for sc.Scan() {
		}
	}()
	select {
	case ok := <-ready:
		if !ok {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			b.Fatal("bare subscriber process did not get ready")
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		b.Fatal("bare subscriber process: not ready after 30s")
	}
	return cmd.Process.Pid, func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				b.Errorf("bare subscriber process: %v", err)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			b.Error("bare subscriber process did not stop within 30s")
		}
	}
}
