package devversion

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// tagOf runs the script in dir.
func tagOf(t *testing.T, dir string) string {
	t.Helper()
	script, err := filepath.Abs("dev-version.sh")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(script, "0.1.0")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CEILING_DIRECTORIES="+filepath.Dir(dir)) // never the project's own checkout
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("dev-version.sh in %s: %v", dir, err)
	}
	return strings.TrimSpace(string(out))
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=test", "-c", "user.email=test@example.com"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v: %s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestATreeThatChangedGetsATagOfItsOwn: images built from a tree that differs from the last
// build's get another tag (so make deploy restarts what changed), and the same tree the same tag.
func TestATreeThatChangedGetsATagOfItsOwn(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatal("git is needed to tag the images the Makefile builds")
	}
	dir := t.TempDir()
	if got := tagOf(t, dir); got != "0.1.0" {
		t.Fatalf("outside a checkout: %q, want the base version", got)
	}

	git(t, dir, "init", "-q")
	write(t, dir, ".gitignore", "bin/\n")
	write(t, dir, "main.go", "package main\n")
	git(t, dir, "add", "-A")
	git(t, dir, "commit", "-q", "-m", "first")
	commit := git(t, dir, "rev-parse", "--short=12", "HEAD")
	clean := "0.1.0-dev." + commit
	if got := tagOf(t, dir); got != clean {
		t.Fatalf("a clean checkout: %q, want %q", got, clean)
	}
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, dir, "bin/tool", "built")
	if got := tagOf(t, dir); got != clean {
		t.Fatalf("with an ignored file: %q, want %q", got, clean)
	}

	changed := regexp.MustCompile(`^0\.1\.0-dev\.` + commit + `\.[0-9a-f]{12}$`)
	write(t, dir, "main.go", "package main\n\nfunc main() {}\n")
	edited := tagOf(t, dir)
	if !changed.MatchString(edited) {
		t.Fatalf("an edited file: %q, want %s", edited, changed)
	}
	write(t, dir, "main.go", "package main\n\nfunc main() { println() }\n")
	editedAgain := tagOf(t, dir)
	if !changed.MatchString(editedAgain) || editedAgain == edited {
		t.Fatalf("edited again: %q, want a tag like %s other than %q", editedAgain, changed, edited)
	}
	write(t, dir, "main.go", "package main\n\nfunc main() {}\n")
	if got := tagOf(t, dir); got != edited {
		t.Fatalf("the first edit again: %q, want its tag %q", got, edited)
	}

	git(t, dir, "checkout", "-q", "--", "main.go")
	write(t, dir, "new.go", "package main\n")
	added := tagOf(t, dir)
	if !changed.MatchString(added) {
		t.Fatalf("a file not added yet: %q, want %s", added, changed)
	}
	write(t, dir, "new.go", "package main // changed\n")
	if got := tagOf(t, dir); got == added {
		t.Fatalf("a file not added yet, changed: the tag stayed %q", got)
	}
}
