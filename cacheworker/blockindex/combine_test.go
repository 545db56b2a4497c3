package blockindex

import (
	"math/rand/v2"
	"testing"
)

func TestCombineChecksumsIsTheChecksumOfTheBytesJoined(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct{ a, b int }{
		{0, 0}, {0, 1}, {1, 0}, {1, 1}, {3, 5}, {4096, 1}, {1, 4096}, {1 << 20, 1<<20 + 3}, {7, 1<<22 + 1},
	} {
		a, b := make([]byte, tc.a), make([]byte, tc.b)
		for i := range a {
			a[i] = byte(r.Uint32())
		}
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		want := Checksum(append(append([]byte{}, a...), b...))
		if got := CombineChecksums(Checksum(a), Checksum(b), int64(len(b))); got != want {
			t.Errorf("%d bytes then %d: combined %08x, the bytes joined %08x", tc.a, tc.b, got, want)
		}
	}
}
