package statefile

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/strata-cache/strata/internal/durable"
)

// Load decodes the JSON file at path into v. A missing file leaves v untouched and is no
// error: it is the state of a plugin that never saved anything.
func Load(path string, v any) error {
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading state file %s: %w", path, err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("decoding state file %s (move it away to start from empty state): %w", path, err)
	}
	return nil
}

// Save writes v as JSON to path atomically, creating the folder (0700) if needed.
func Save(path string, v any) error {
	raw, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding state for %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating state folder %s: %w", dir, err)
	}
	if err := durable.ReplaceFile(path, append(raw, '\n'), 0o600); err != nil {
		return fmt.Errorf("saving state: %w", err)
	}
	return nil
}
