"""Consumer-group workers over the shard feeds: receipts, run progress, the receipt API.

Workers turn committed events into read-only receipts and per-run progress views,
copying no raw payload; the HTTP API serves the receipts.
"""

from projections.facts import ObservedFact, observed_facts
from projections.feed import FeedEntry, Outcome
from projections.http_api import create_app
from projections.progress import ProgressView, ProgressWorker, read_view
from projections.receipts.builder import Receipt, build_receipt
from projections.receipts.projection import ReceiptWorker
from projections.worker.runtime import Worker

__all__ = [
    "FeedEntry",
    "ObservedFact",
    "Outcome",
    "ProgressView",
    "ProgressWorker",
    "Receipt",
    "ReceiptWorker",
    "Worker",
    "build_receipt",
    "create_app",
    "observed_facts",
    "read_view",
]
