// Package pki gives Strata's components their identities and the TLS they speak with them.
//
// Every component holds a short-lived certificate from Strata's internal CA that names its role
// in a URI SAN (spiffe://strata.dev/<role>/...): the operator, each master replica, the worker
// of one TierPool on one node, the CSI node plugin of one node. Servers demand such a
// certificate from every client (TLS 1.3, mutual); the identity it carries is what the
// per-method authorization (package authz) decides on.
//
// The operator holds the CA (a Secret of the release namespace it creates on first start) and
// issues certificates to pods that prove who they are with a projected ServiceAccount token
// (Issuer, IssuerClient); a component renews its certificate in memory before it expires
// (Renewer), so rotation restarts nothing and breaks no connection.
package pki
