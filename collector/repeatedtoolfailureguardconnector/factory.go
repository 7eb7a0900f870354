package repeatedtoolfailureguardconnector // import "github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector"

import (
	"context"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/connector"
	"go.opentelemetry.io/collector/consumer"

	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/metadata"
)

// NewFactory returns the factory of the repeated_tool_failure_guard connector.
func NewFactory() connector.Factory {
	return connector.NewFactory(
		metadata.Type,
		func() component.Config { return createDefaultConfig() },
		connector.WithTracesToMetrics(createTracesToMetrics, metadata.TracesToMetricsStability),
		connector.WithTracesToLogs(createTracesToLogs, metadata.TracesToLogsStability),
	)
}

func createTracesToMetrics(_ context.Context, set connector.Settings, cfg component.Config, next consumer.Metrics) (connector.Traces, error) {
	return newConnector(set, cfg.(*Config), &metricsEmitter{next: next})
}

func createTracesToLogs(_ context.Context, set connector.Settings, cfg component.Config, next consumer.Logs) (connector.Traces, error) {
	return newConnector(set, cfg.(*Config), &logsEmitter{next: next})
}
