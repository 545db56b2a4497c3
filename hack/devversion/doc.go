// Package devversion holds hack/devversion/dev-version.sh, which the Makefile runs to tag the
// images it builds, and its test.
package devversion
