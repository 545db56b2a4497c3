package controllers

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

func TestNamesMadeForADatasetFitALabelValue(t *testing.T) {
	cases := map[string]struct{ dataset, suffix, want string }{
		"a short name is kept":                        {"images", "-preload", "images-preload"},
		"a long name is cut to fit":                   {strings.Repeat("a", 60), "-preload", strings.Repeat("a", 55) + "-preload"},
		"a cut never leaves a dash before the suffix": {strings.Repeat("a", 49) + "-b.c" + strings.Repeat("d", 20), "-claim-server", strings.Repeat("a", 49) + "-claim-server"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			got := childName(&datav1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{Name: tc.dataset}}, tc.suffix)
			g.Expect(got).To(Equal(tc.want))
			g.Expect(validation.IsValidLabelValue(got)).To(BeEmpty())
		})
	}
}
