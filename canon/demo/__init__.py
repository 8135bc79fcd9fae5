"""The demo: a simulated agent harness driving realistic tools through the store."""
