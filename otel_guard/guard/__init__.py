"""The span processor that feeds the reducer, its fused dispatch, its mode and its telemetry."""
