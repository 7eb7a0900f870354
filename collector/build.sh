#!/usr/bin/env bash
# Builds the otelcol-guard distribution into collector/_build/otelcol-guard.
#
# Installs the pinned Collector builder (ocb) into collector/_build/bin from the Go module proxy,
# then runs it on builder-config.yaml. Idempotent: the builder is installed once, and Go's module
# and build caches make a second build fast. Needs Go (go.mod's version or newer) and access to
# the Go module proxy.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
builder_version=v0.161.0
bin_dir="$here/_build/bin"
builder="$bin_dir/ocb-$builder_version"

mkdir -p "$bin_dir"
if [ ! -x "$builder" ]; then
    GOBIN="$bin_dir" go install "go.opentelemetry.io/collector/cmd/builder@$builder_version"
    mv "$bin_dir/builder" "$builder"
fi
cd "$here"
"$builder" --config builder-config.yaml "$@"
echo "built $here/_build/otelcol-guard"
