"""Ready-made wiring of the guard into agent frameworks; each behind its own optional extra."""
