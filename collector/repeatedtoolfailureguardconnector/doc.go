// Package repeatedtoolfailureguardconnector reads AI agents' traces in the Collector, runs the
// repeated-tool-failure guard on them in shadow mode and emits its decisions as metrics and
// log records (docs/contract.md section 8).
//
//go:generate mdatagen metadata.yaml
package repeatedtoolfailureguardconnector // import "github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector"
