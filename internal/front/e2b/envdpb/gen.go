// Package envdpb holds the generated code of envd's wire format: the
// process and filesystem services the E2B SDKs call, written in
// process/process.proto and filesystem/filesystem.proto.
package envdpb

//go:generate ./gen.sh
