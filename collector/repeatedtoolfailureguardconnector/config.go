package repeatedtoolfailureguardconnector // import "github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector"

import (
	"errors"
	"fmt"
	"time"
)

// Defaults of the configuration. They follow the Python guard's bounds (max_prompts, the
// prompt TTL: DEFAULT_MAX_PROMPTS and DEFAULT_PROMPT_TTL_SECONDS of otel_guard), so the same
// input gives the same decisions as `otel-guard replay`, and size the call data and the wait
// window for a collector of a gateway tier.
const (
	defaultMaxPrompts   = 10000
	defaultPromptTTL    = 6 * time.Hour
	defaultMaxCallBytes = 64 << 20
	defaultWait         = 30 * time.Second

	// Bounds that catch a unit mistake (a bare number is read as nanoseconds or bytes, seconds
	// typed as hours and the like).
	maxMaxPrompts   = 10_000_000
	minWait         = time.Millisecond
	maxWait         = 24 * time.Hour
	maxPromptTTL    = 7 * 24 * time.Hour
	minMaxCallBytes = 1024
	// int64: also on platforms whose int has 32 bits.
	maxMaxCallBytes int64 = 64 << 30
)

// Config is the connector's configuration.
type Config struct {
	// MaxPrompts bounds the prompts whose guard state is kept; the oldest idle one is evicted
	// first (diagnostic `evicted`).
	MaxPrompts int `mapstructure:"max_prompts"`
	// PromptTTL drops a prompt's state when none of its spans arrived for this long
	// (diagnostic `expired`).
	PromptTTL time.Duration `mapstructure:"prompt_ttl"`
	// MaxCallBytes bounds, in bytes, the span data buffered across all traces and open
	// batches; past it the oldest trace is assembled at once (diagnostic `batch_overflow`).
	MaxCallBytes int `mapstructure:"max_call_bytes"`
	// Wait is how long a trace's spans are buffered after its last span arrived before they
	// are ordered and replayed through the guard, so that late and out-of-order spans of one
	// prompt are still seen in order. A span of a trace already replayed is `late_span`.
	Wait time.Duration `mapstructure:"wait"`

	// Prevents unkeyed literals.
	_ struct{}
}

func createDefaultConfig() *Config {
	return &Config{
		MaxPrompts:   defaultMaxPrompts,
		PromptTTL:    defaultPromptTTL,
		MaxCallBytes: defaultMaxCallBytes,
		Wait:         defaultWait,
	}
}

// Validate checks every key: positive, and within bounds that catch a unit mistake.
func (c *Config) Validate() error {
	var errs []error
	if c.MaxPrompts <= 0 || c.MaxPrompts > maxMaxPrompts {
		errs = append(errs, fmt.Errorf("max_prompts must be between 1 and %d, got %d", maxMaxPrompts, c.MaxPrompts))
	}
	if c.PromptTTL <= 0 || c.PromptTTL > maxPromptTTL {
		errs = append(errs, fmt.Errorf("prompt_ttl must be positive and at most %s, got %s", maxPromptTTL, c.PromptTTL))
	}
	if c.MaxCallBytes < minMaxCallBytes || int64(c.MaxCallBytes) > maxMaxCallBytes {
		errs = append(errs, fmt.Errorf("max_call_bytes must be between %d and %d, got %d", minMaxCallBytes, maxMaxCallBytes, c.MaxCallBytes))
	}
	if c.Wait < minWait || c.Wait > maxWait {
		errs = append(errs, fmt.Errorf("wait must be between %s and %s, got %s", minWait, maxWait, c.Wait))
	}
	if c.Wait > 0 && c.PromptTTL > 0 && c.PromptTTL < c.Wait {
		errs = append(errs, fmt.Errorf("prompt_ttl (%s) must not be shorter than wait (%s)", c.PromptTTL, c.Wait))
	}
	return errors.Join(errs...)
}
