// Package masterpb holds the master's gRPC API and the Raft command envelope, generated from
// master.proto by hack/gen-proto.sh. Edit the .proto, never the generated files.
package masterpb
