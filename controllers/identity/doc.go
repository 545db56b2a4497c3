// Package identity is the operator's side of component identity: it keeps Strata's CA in a
// Secret of the release namespace (made on first start) with its public half in a ConfigMap
// that components mount, and it tells which component a projected ServiceAccount token belongs
// to, so that the issuer (package pki) certifies only Strata's own pods, each for itself.
package identity
