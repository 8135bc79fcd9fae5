"""A worker's outage: pauses double up to a cap; one line when it starts, one when it ends."""

from __future__ import annotations

from structlog.testing import capture_logs

from projections.worker.outage import Outage


class Clock:
    """Monotonic seconds the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_pauses_double_up_to_the_cap() -> None:
    """0.25 s, then twice as long each failure, never above the cap; a success resets it."""
    outage = Outage("receipts", first_pause_s=0.25, max_pause_s=5.0, clock=Clock())
    with capture_logs():
        pauses = [outage.failed("ConnectionError") for _ in range(8)]
        assert pauses == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
        outage.succeeded()
        assert not outage.down and outage.failed("ConnectionError") == 0.25


def test_an_outage_logs_its_start_a_rare_reminder_and_its_end() -> None:
    """Hundreds of failed reads over five minutes are five lines, not hundreds."""
    clock = Clock()
    outage = Outage("progress", remind_s=60.0, clock=clock)
    with capture_logs() as logs:
        for _ in range(300):
            outage.failed("ConnectionError", shards=4)
            clock.now += 1.0
        outage.succeeded(shards=4)
        outage.succeeded(shards=4)  # no outage any more: nothing to say
    events = [entry["event"] for entry in logs]
    assert events == ["worker_read_failed"] + ["worker_still_unavailable"] * 4 + ["redis_recovered"]
    recovered = logs[-1]
    assert recovered["failures"] == 300 and recovered["down_s"] == 300.0
    assert recovered["projection"] == "progress" and recovered["log_level"] == "info"
