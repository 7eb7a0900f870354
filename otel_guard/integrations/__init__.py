"""Span producers for agents: helpers for any Python agent, and framework wiring behind extras."""
