// Package humanize writes quantities as people read them in `kubectl get` columns and in
// `kubectl strata`'s tables.
package humanize

import "fmt"

// Bytes writes n in binary units with one decimal: 512B, 1.5Ki, 3.0Gi.
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	v, suffix := float64(n)/unit, "Ki"
	for _, s := range []string{"Mi", "Gi", "Ti", "Pi"} {
		if v < unit {
			break
		}
		v, suffix = v/unit, s
	}
	return fmt.Sprintf("%.1f%s", v, suffix)
}

// Percent writes part of whole as a whole percentage, rounded down (so 100% means all of
// it) and at most 100%; 0% of nothing.
func Percent(part, whole int64) string {
	if whole <= 0 {
		return "0%"
	}
	return fmt.Sprintf("%d%%", min(100, part*100/whole))
}
