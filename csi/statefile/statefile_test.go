package statefile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type record struct {
	Names map[string]int `json:"names"`
}

func TestLoadOfAMissingFileLeavesTheValueEmpty(t *testing.T) {
	var r record
	if err := Load(filepath.Join(t.TempDir(), "absent.json"), &r); err != nil {
		t.Fatalf("Load of a missing file: %v", err)
	}
	if r.Names != nil {
		t.Fatalf("Load of a missing file filled %v", r.Names)
	}
}

func TestSaveThenLoadRoundTripsAndLeavesNoTemporaryFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nested")
	path := filepath.Join(dir, "state.json")
	for i := range 3 {
		if err := Save(path, record{Names: map[string]int{"a": i}}); err != nil {
			t.Fatalf("Save #%d: %v", i, err)
		}
	}
	var r record
	if err := Load(path, &r); err != nil {
		t.Fatalf("Load: %v", err)
	}
	if r.Names["a"] != 2 {
		t.Fatalf("Load returned %v, want the last saved state", r.Names)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("the state folder holds %v, want only state.json", names)
	}
}

func TestLoadOfACorruptFileSaysWhichFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	var r record
	err := Load(path, &r)
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Load of a corrupt file returned %v, want an error naming %s", err, path)
	}
}
