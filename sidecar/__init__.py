"""loopstop: a sidecar for n8n that makes automation loops stop for good."""

__version__ = "0.1.0"
