package fuseconn

import (
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	. "github.com/onsi/gomega"
)

func TestATakeoverMustSettleWhatTheMountSettled(t *testing.T) {
	mounted := fuse.InitOut{Minor: 41, Flags: 0x1234, Flags2: 0x2, MaxWrite: MaxRead, MaxPages: 256, MaxReadAhead: 128 << 10}
	for name, tc := range map[string]struct {
		change func(*fuse.InitOut)
		ok     bool
	}{
		"the same":                   {change: func(*fuse.InitOut) {}, ok: true},
		"another flag (passthrough)": {change: func(o *fuse.InitOut) { o.Flags2 = 0 }},
		"another protocol minor":     {change: func(o *fuse.InitOut) { o.Minor = 40 }},
		"another max write":          {change: func(o *fuse.InitOut) { o.MaxWrite = 128 << 10 }},
		"another max pages":          {change: func(o *fuse.InitOut) { o.MaxPages = 32 }},
		"another read-ahead":         {change: func(o *fuse.InitOut) { o.MaxReadAhead = 0 }},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			now := mounted
			tc.change(&now)
			err := sameSettings(mounted, now)
			if tc.ok {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			g.Expect(err).To(MatchError(ContainSubstring("must be mounted afresh")))
		})
	}
}
