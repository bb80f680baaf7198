package dotnetdevkit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testingProgram uses Virtufin.Worker.Testing: its WorkerHarness must
// complete outputs as the node does (the expected ids come from Go).
const testingProgram = `
using System.Collections.Generic;
using System.Threading.Tasks;
using Virtufin.Worker;
using Virtufin.Worker.Json;
using Virtufin.Worker.Testing;

public sealed class Two : IMultiOutputWorker
{
    public Task<IList<CloudEvent>> ProcessAllAsync(CloudEvent input)
    {
        IList<CloudEvent> outs = new List<CloudEvent> { new CloudEvent { Type = "a" }, new CloudEvent { Type = "b", Id = "mine", Source = "urn:me" } };
        return Task.FromResult(outs);
    }
}

public static class Checks
{
    public static int Main(string[] args) { return TestRunner.Run(args); }

    [Test]
    public static void CompletesOutputsAsTheNode()
    {
        var outs = WorkerHarness.Run(new Two(), WorkerHarness.Event("t", new JsonObject(), id: "e-1", source: "shop", correlationId: "c-9"), "w-1");
        Assert.Equal(2, outs.Count, "outputs");
        Assert.Equal("e-1/w-1/0/TAG", outs[0].Id, "default id");
        Assert.Equal("workmanager/workers/w-1", outs[0].Source, "default source");
        Assert.Equal("c-9", (string)outs[0]["correlationid"], "correlation id");
        Assert.Equal("mine", outs[1].Id, "own id");
        Assert.Equal("urn:me", outs[1].Source, "own source");
    }

    [Test]
    public static void NoCorrelationWithoutOne()
    {
        var outs = WorkerHarness.Run(new Two(), WorkerHarness.Event("t", null, id: LONG));
        Assert.True(outs[0]["correlationid"] == null, "no correlation id");
        Assert.Equal("LONGBASE/local/0/LOCALTAG", outs[0].Id, "id of a long input id");
    }

    const string LONG = "LONGID";

    [Test]
    public static void FailsOnPurpose()
    {
        Assert.Equal("x", "y", "on purpose");
    }
}
`

// The test helper (testing/) compiles warning-free next to the DevKit, its
// TestRunner reports and exits as documented, and WorkerHarness completes
// outputs the way the node does.
func TestTestingHelper(t *testing.T) {
	mcs, err1 := exec.LookPath("mcs")
	mono, err2 := exec.LookPath("mono")
	if err1 != nil || err2 != nil {
		t.Fatal("mcs and mono are needed: `make test` installs mono-mcs and mono-runtime")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var devkit, helper []string
	for n, b := range Sources() {
		devkit = append(devkit, write("src/"+n, b))
	}
	for n, b := range TestingSources() {
		helper = append(helper, write("testing/"+n, b))
	}
	hex8 := func(s string, n int) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:n]) }
	long := strings.Repeat("x", 65)
	prog := strings.NewReplacer("TAG", hex8("shop", 4), "LONGID", long, "LONGBASE", "sha256:"+hex8(long, 16), "LOCALTAG", hex8("local", 4)).Replace(testingProgram)
	main := write("Checks.cs", []byte(prog))
	run := func(name string, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	lib := filepath.Join(dir, "Virtufin.Worker.dll")
	if out, err := run(mcs, append([]string{"-target:library", "-out:" + lib}, devkit...)...); err != nil {
		t.Fatalf("DevKit: %v\n%s", err, out)
	}
	// The helper alone, with its documentation checked, warnings as errors.
	if out, err := run(mcs, append([]string{"-target:library", "-warnaserror+", "-doc:" + filepath.Join(dir, "t.xml"), "-r:" + lib, "-out:" + filepath.Join(dir, "t.dll")}, helper...)...); err != nil || strings.Contains(out, "warning") {
		t.Fatalf("testing/: %v\n%s", err, out)
	}
	exe := filepath.Join(dir, "checks.exe")
	if out, err := run(mcs, append([]string{"-r:" + lib, "-out:" + exe, main}, helper...)...); err != nil {
		t.Fatalf("checks: %v\n%s", err, out)
	}
	out, err := run(mono, exe)
	for _, want := range []string{"PASS Checks.CompletesOutputsAsTheNode", "PASS Checks.NoCorrelationWithoutOne",
		"FAIL Checks.FailsOnPurpose: on purpose: expected <x> but got <y>", "3 tests, 2 passed, 1 failed"} {
		if !strings.Contains(out, want) {
			t.Fatalf("output lacks %q:\n%s", want, out)
		}
	}
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v, want 1 (a test failed)", err)
	}
	out, err = run(mono, exe, "Completes")
	if err != nil || !strings.Contains(out, "1 tests, 1 passed, 0 failed") {
		t.Fatalf("filtered: %v\n%s", err, out)
	}
}
