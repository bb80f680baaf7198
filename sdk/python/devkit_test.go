package devkit

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every file of the package is embedded except the runner link, and
// Install writes them readable by everyone, once.
func TestInstallShipsThePackage(t *testing.T) {
	var want []string
	err := filepath.WalkDir(filepath.Join("src", "virtufin_worker"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(d.Name(), "_runner") || strings.Contains(path, "__pycache__") {
			return err
		}
		rel, _ := filepath.Rel("src", path)
		want = append(want, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	got, err := Install(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, rel := range want {
		info, err := os.Stat(filepath.Join(got, rel))
		if err != nil {
			t.Errorf("%s not installed: %v", rel, err)
			continue
		}
		if info.Mode().Perm()&0o444 != 0o444 {
			t.Errorf("%s is %v, not readable by all", rel, info.Mode())
		}
	}
	if _, err := os.Stat(filepath.Join(got, "virtufin_worker", "_runner.py")); !os.IsNotExist(err) {
		t.Errorf("the runner link was installed: %v", err)
	}
	again, err := Install(dir)
	if err != nil || again != got {
		t.Fatalf("second install: %s %v", again, err)
	}
	if v := Version(); v == "" || !strings.Contains(got, "virtufin_worker-"+v+"-") {
		t.Fatalf("version %q, dir %s", v, got)
	}
}

// A complete copy is reused as it is (a node's workers may be importing
// from it); an incomplete one (no .complete: an install that died) is
// replaced.
func TestInstallReusesCompleteCopiesOnly(t *testing.T) {
	dir := t.TempDir()
	first, err := Install(dir)
	if err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(first, "virtufin_worker", "in-use")
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if again, err := Install(dir); err != nil || again != first {
		t.Fatalf("%s %v", again, err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("a complete copy was replaced: %v", err)
	}
	if err := os.Remove(filepath.Join(first, ".complete")); err != nil {
		t.Fatal(err)
	}
	if again, err := Install(dir); err != nil || again != first {
		t.Fatalf("%s %v", again, err)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("an incomplete copy was kept: %v", err)
	}
	if _, err := os.Stat(filepath.Join(first, ".complete")); err != nil {
		t.Fatalf("the new copy is not complete: %v", err)
	}
}
