#!/usr/bin/env bash
# Generates internal/nodepb from proto/quill/v1 with pinned plugins (the
# versions appear in the generated headers, so any other version shows up as
# a diff). `scripts/proto.sh check` generates into a scratch directory and
# fails if internal/nodepb differs from it: CI runs it so that a .proto edited
# without regenerating, or generated code edited by hand, does not land.
set -euo pipefail
cd "$(dirname "$0")/.."
PROTOC_GEN_GO=google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_GO_GRPC=google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
PROTOC_WANT="libprotoc 3.21.12"

bin="$(go env GOPATH)/bin"
export PATH="$bin:$PATH"
if ! command -v protoc >/dev/null || [ "$(protoc --version)" != "$PROTOC_WANT" ]; then
  echo "proto: need $PROTOC_WANT (Debian protobuf-compiler; scripts/test-deps.sh installs it), have: $(protoc --version 2>&1 || true)" >&2
  exit 1
fi
[ "$(protoc-gen-go --version 2>/dev/null)" = "protoc-gen-go v1.36.12" ] || go install "$PROTOC_GEN_GO"
[ "$(protoc-gen-go-grpc --version 2>/dev/null)" = "protoc-gen-go-grpc 1.6.2" ] || go install "$PROTOC_GEN_GO_GRPC"

gen() { # gen OUTDIR
  protoc -I proto \
    --go_out="$1" --go_opt=module=github.com/quillmail/quill \
    --go-grpc_out="$1" --go-grpc_opt=module=github.com/quillmail/quill \
    proto/quill/v1/*.proto
}

if [ "${1:-}" = check ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  gen "$tmp"
  stale=0
  for f in "$tmp"/internal/nodepb/*.go; do
    name=$(basename "$f")
    if ! cmp -s "$f" "internal/nodepb/$name"; then
      echo "proto: internal/nodepb/$name is not what proto/quill/v1 generates; run make proto" >&2
      stale=1
    fi
  done
  for f in internal/nodepb/*.pb.go; do
    [ -e "$tmp/internal/nodepb/$(basename "$f")" ] || { echo "proto: $f has no .proto any more; run make proto" >&2; stale=1; }
  done
  exit $stale
fi
rm -f internal/nodepb/*.pb.go
gen .
