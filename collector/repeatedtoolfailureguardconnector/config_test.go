package repeatedtoolfailureguardconnector

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/metadata"
)

func TestLoadConfig(t *testing.T) {
	cm, err := confmaptest.LoadConf(filepath.Join("testdata", "config.yaml"))
	require.NoError(t, err)
	tests := []struct {
		id       component.ID
		expected *Config
		errs     []string
	}{
		{id: component.NewID(metadata.Type), expected: createDefaultConfig()},
		{
			id:       component.NewIDWithName(metadata.Type, "custom"),
			expected: &Config{MaxPrompts: 500, PromptTTL: 30 * time.Minute, MaxCallBytes: 1 << 20, Wait: 2 * time.Second},
		},
		{id: component.NewIDWithName(metadata.Type, "bare_wait"), errs: []string{"wait must be between 1ms and 24h0m0s, got 30ns"}},
		{
			id: component.NewIDWithName(metadata.Type, "negative"),
			errs: []string{
				"max_prompts must be between 1 and 10000000, got -1",
				"prompt_ttl must be positive and at most 168h0m0s, got -1m0s",
				"max_call_bytes must be between 1024 and 68719476736, got -5",
				"wait must be between 1ms and 24h0m0s, got -1s",
			},
		},
		{
			id: component.NewIDWithName(metadata.Type, "absurd"),
			errs: []string{
				"max_prompts must be between 1 and 10000000, got 20000000",
				"prompt_ttl must be positive and at most 168h0m0s, got 87600h0m0s",
				"max_call_bytes must be between 1024 and 68719476736, got 1099511627776",
				"wait must be between 1ms and 24h0m0s, got 48h0m0s",
			},
		},
		{id: component.NewIDWithName(metadata.Type, "ttl_below_wait"), errs: []string{"prompt_ttl (10s) must not be shorter than wait (1m0s)"}},
	}
	for _, tt := range tests {
		t.Run(tt.id.String(), func(t *testing.T) {
			cfg := NewFactory().CreateDefaultConfig()
			sub, err := cm.Sub(tt.id.String())
			require.NoError(t, err)
			require.NoError(t, sub.Unmarshal(cfg))
			err = cfg.(*Config).Validate()
			if len(tt.errs) == 0 {
				require.NoError(t, err)
				require.Equal(t, tt.expected, cfg)
				return
			}
			require.Error(t, err)
			for _, msg := range tt.errs {
				require.ErrorContains(t, err, msg)
			}
		})
	}
}

// The configuration example of the README loads, validates, and shows the defaults.
func TestREADMEConfigExampleLoads(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(readme, -1)
	require.NotEmpty(t, blocks)
	path := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, os.WriteFile(path, blocks[0][1], 0o600))
	cm, err := confmaptest.LoadConf(path)
	require.NoError(t, err)
	sub, err := cm.Sub("connectors::" + metadata.Type.String())
	require.NoError(t, err)
	cfg := NewFactory().CreateDefaultConfig()
	require.NoError(t, sub.Unmarshal(cfg))
	require.NoError(t, cfg.(*Config).Validate())
	require.Equal(t, createDefaultConfig(), cfg)
	pipelines, err := cm.Sub("service::pipelines")
	require.NoError(t, err)
	require.Equal(t, []any{metadata.Type.String()}, pipelines.Get("traces::exporters"))
}
