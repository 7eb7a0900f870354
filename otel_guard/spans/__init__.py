"""Span input: the attribute names the guard reads (the ``acp`` profile) and the GenAI profile."""
