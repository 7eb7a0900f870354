"""What leaves the process: the sensitive-attribute registry, span redaction and pseudonyms."""
