// Package logadapter lets the master's dependencies log through the project's logr.Logger:
// hashicorp/raft speaks hclog and BadgerDB has its own four-method interface.
package logadapter
