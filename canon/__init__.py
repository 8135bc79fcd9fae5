"""The ``canon`` command line: demo, workers, receipt API, replay and audit."""
