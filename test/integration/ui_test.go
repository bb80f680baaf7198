package integration

import (
	"context"
	"fmt"
	"image"
	"image/png"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/workflows"
)

// updateScreenshotsEnv, when set, makes TestTemporalUIScreenshots write its
// screenshots into docs/images (docs/operating.md shows them).
const updateScreenshotsEnv = "WM_UPDATE_SCREENSHOTS"

// Issue 14, done when: the Temporal UI screenshots of docs/operating.md are
// produced by a test from the running stack (headless Chromium, Debian's
// chromium-headless-shell): the workflow list found by search attributes,
// and one worker's life (its updates and activities) in its history.
func TestTemporalUIScreenshots(t *testing.T) {
	inTurn(t) // functional, no timing assertions: runs next to the other parallel tests after the serial ones
	chromium, err := exec.LookPath("chromium-headless-shell")
	if err != nil {
		t.Fatalf("chromium-headless-shell is not installed (make test installs it): %v", err)
	}
	e := newEnvWith(t, envConfig{ui: true})
	topic := "orders"
	id := e.createWith(t, &pb.CreateWorkerRequest{Topic: topic, Group: "shop", Name: "order-pricer", Code: pyCode(echoWorker("order.priced", "v1"))})
	if _, err := e.client.StopWorker(ctxT(t), &pb.StopWorkerRequest{WorkerId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.StartWorker(ctxT(t), &pb.StartWorkerRequest{WorkerId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.LoadCode(ctxT(t), &pb.LoadCodeRequest{WorkerId: id, Code: pyCode(echoWorker("order.priced", "v2"))}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.RollbackWorker(ctxT(t), &pb.RollbackWorkerRequest{WorkerId: id, Version: 1}); err != nil {
		t.Fatal(err)
	}
	e.createWith(t, &pb.CreateWorkerRequest{Topic: "invoices", Name: "invoice-mailer", Code: pyCode(echoWorker("invoice.sent", "v1"))})

	tc := e.temporalClient(t)
	desc, err := tc.DescribeWorkflowExecution(ctxT(t), workflows.WorkflowID(id), "")
	if err != nil {
		t.Fatal(err)
	}
	runID := desc.GetWorkflowExecutionInfo().GetExecution().GetRunId()
	wfURL := fmt.Sprintf("%s/namespaces/default/workflows/%s/%s", e.stack.UIURL, url.PathEscape(workflows.WorkflowID(id)), runID)
	query := url.QueryEscape(fmt.Sprintf(`WorkerTopic="%s" AND WorkerStatus="RUNNING"`, topic))

	outDir := t.TempDir()
	if os.Getenv(updateScreenshotsEnv) != "" {
		outDir = filepath.Join(repoRoot(), "docs", "images")
	}
	alloc, cancel := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1440, 900),
		chromedp.UserDataDir(t.TempDir()))...)
	defer cancel()
	browser, cancel := chromedp.NewContext(alloc)
	defer cancel()
	for _, shot := range []struct {
		name, url string
		height    int64    // of the viewport
		want      []string // texts the page must show before the screenshot
	}{
		{"temporal-ui-workers.png", e.stack.UIURL + "/namespaces/default/workflows?query=" + query, 600,
			[]string{workflows.WorkflowID(id), "WorkerWorkflow", "1 Running"}},
		{"temporal-ui-worker-history.png", wfURL + "/history", 1800,
			[]string{"WorkerWorkflow", "PrepareCode", "Apply", "load_code"}},
	} {
		path := filepath.Join(outDir, shot.name)
		screenshot(t, browser, shot.url, shot.height, shot.want, path)
		checkScreenshot(t, path, shot.height)
		t.Logf("%s: %s", shot.name, path)
	}
}

// screenshot opens page in browser (a viewport 1440 wide and height
// high), waits (at most three minutes, a bound for a hang: the page took
// over one under a soak's load, run under load 1) until its text
// holds every string of want, and writes a PNG of the window to path.
func screenshot(t *testing.T, browser context.Context, page string, height int64, want []string, path string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(browser, 3*time.Minute)
	defer cancel()
	ctx, cancelTab := chromedp.NewContext(ctx)
	defer cancelTab()
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1440, height), chromedp.Navigate(page)); err != nil {
		t.Fatalf("%s: %v", page, err)
	}
	var text string
	for missing := "?"; missing != ""; {
		var err error
		if text, err = chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body"))); err != nil {
			t.Fatalf("%s: %v", page, err)
		}
		missing = ""
		for _, w := range want {
			if !strings.Contains(text, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: the page never showed %q\npage text: %.3000s", page, missing, text)
		case <-time.After(250 * time.Millisecond):
		}
	}
	if err := chromedp.Do(ctx, chromedp.Sleep(500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("%s: screenshot: %v", page, err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkScreenshot fails unless path is a PNG of the window's size showing
// more than a blank page.
func checkScreenshot(t *testing.T, path string, height int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() != 1440 || int64(b.Dy()) != height {
		t.Fatalf("%s: %v, want 1440x%d", path, b, height)
	}
	if n := colors(img); n < 20 {
		t.Fatalf("%s: only %d colours: a blank page?", path, n)
	}
}

func colors(img image.Image) int {
	seen := map[[3]uint32]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y += 3 {
		for x := b.Min.X; x < b.Max.X; x += 3 {
			r, g, bl, _ := img.At(x, y).RGBA()
			seen[[3]uint32{r >> 8, g >> 8, bl >> 8}] = true
		}
	}
	return len(seen)
}
