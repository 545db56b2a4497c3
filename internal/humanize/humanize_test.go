package humanize

import "testing"

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0B", 1023: "1023B", 1024: "1.0Ki", 3<<20 + 1000: "3.0Mi", 5 << 40: "5.0Ti"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestPercent(t *testing.T) {
	for _, c := range []struct {
		part, whole int64
		want        string
	}{
		{0, 0, "0%"}, {5, 0, "0%"}, {0, 10, "0%"}, {999, 1000, "99%"}, {1000, 1000, "100%"}, {1200, 1000, "100%"},
	} {
		if got := Percent(c.part, c.whole); got != c.want {
			t.Errorf("Percent(%d, %d) = %q, want %q", c.part, c.whole, got, c.want)
		}
	}
}
