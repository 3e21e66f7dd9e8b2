#!/bin/sh
# Regenerates the Go code of envd's wire format. Needs protoc (Debian:
# apt-get install protobuf-compiler); the plugins are built from the module
# versions go.mod pins.
set -eu
cd "$(dirname "$0")"
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/" google.golang.org/protobuf/cmd/protoc-gen-go connectrpc.com/connect/cmd/protoc-gen-connect-go
PATH="$bin:$PATH" protoc -I . -I /usr/include \
	--go_out=. --go_opt=paths=source_relative \
	--connect-go_out=. --connect-go_opt=paths=source_relative \
	process/process.proto filesystem/filesystem.proto
