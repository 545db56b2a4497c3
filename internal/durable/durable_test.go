package durable

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReplaceFile(t *testing.T) {
	cases := map[string]struct {
		before  []byte // nil: no file before
		perm    fs.FileMode
		missing bool // the folder does not exist
		wantErr string
	}{
		"a new file":                       {perm: 0o644},
		"a file replaced":                  {before: []byte("old content, longer than the new"), perm: 0o600},
		"the mode asked, not CreateTemp's": {before: []byte("x"), perm: 0o640},
		"a folder that does not exist":     {perm: 0o644, missing: true, wantErr: "creating a temporary file in"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.missing {
				dir = filepath.Join(dir, "nowhere")
			}
			path := filepath.Join(dir, "state.json")
			if tc.before != nil {
				if err := os.WriteFile(path, tc.before, 0o666); err != nil {
					t.Fatal(err)
				}
			}
			err := ReplaceFile(path, []byte("new"), tc.perm)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ReplaceFile = %v, want an error saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ReplaceFile: %v", err)
			}
			got, err := os.ReadFile(path)
			if err != nil || string(got) != "new" {
				t.Fatalf("the file holds %q (%v), want %q", got, err, "new")
			}
			info, err := os.Stat(path)
			if err != nil || info.Mode().Perm() != tc.perm {
				t.Fatalf("the file's mode is %v (%v), want %v", info.Mode().Perm(), err, tc.perm)
			}
			entries, err := os.ReadDir(dir)
			if err != nil || len(entries) != 1 {
				t.Fatalf("the folder holds %v (%v), want the file alone: no temporary file left", entries, err)
			}
		})
	}
}

func TestSyncDirSaysWhichFolderIsMissing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "gone")
	if err := SyncDir(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("SyncDir of a missing folder = %v, want an error naming it", err)
	}
	if err := SyncDir(t.TempDir()); err != nil {
		t.Fatalf("SyncDir: %v", err)
	}
}
