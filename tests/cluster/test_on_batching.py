"""On the cluster: concurrent script calls without the batcher.

The tests of ``tests/integration/test_batching.py`` that hold for any client, collected
again (``reuse.py``). A cluster client is not batched (a cluster pipeline splits by node),
so here they show that the same concurrent calls, sent one by one, keep each
invocation's event order and refuse only the duplicate.
"""

from __future__ import annotations

from tests.cluster.reuse import single_server_tests
from tests.integration import test_batching as single_server

_NOT_BATCHED = "asserts pipelines and round trips; a cluster client is not batched"
_OWN_SERVER = "runs a single server of its own (script flush, killed connections, shutdown)"

EXCLUDED = {
    "test_concurrent_appends_share_round_trips": _NOT_BATCHED,
    "test_a_batch_runs_in_call_order": _NOT_BATCHED,
    "test_a_large_turn_is_split_into_pipelines_of_max_batch": _NOT_BATCHED,
    "test_by_default_pipelines_are_sized_by_the_calls_outstanding": _NOT_BATCHED,
    "test_a_failing_command_does_not_fail_its_neighbours": _NOT_BATCHED,
    "test_a_caller_cancelled_before_the_flush_is_never_sent": (
        "cancels a call queued for the next flush; an unbatched call has no queue"
    ),
    "test_a_caller_cancelled_in_flight_leaves_the_others_answered": (
        "cancels a caller of a pipeline on the wire; an unbatched call has no pipeline"
    ),
    "test_noscript_after_script_flush_is_recovered_inside_a_batch": _OWN_SERVER,
    "test_killed_connections_are_retried_without_double_writes": _OWN_SERVER,
    "test_an_unreachable_server_fails_every_caller_of_the_batch": _OWN_SERVER,
    "test_a_stalled_server_times_out_the_batch_and_every_caller_hears_it": _OWN_SERVER,
    "test_a_short_stall_is_ridden_out_by_the_retries": _OWN_SERVER,
    "test_connections_kept_under_load_go_back_to_the_pool_when_it_ends": _OWN_SERVER,
    "test_at_most_max_lanes_pipelines_are_in_flight_each_on_one_connection": _NOT_BATCHED,
    "test_a_lone_call_with_nothing_else_to_run_costs_no_extra_turn_of_the_loop": _NOT_BATCHED,
    "test_lanes_and_batches_must_be_at_least_one": (
        "builds batchers only, touching no server; it already runs once"
    ),
    "test_a_cluster_client_is_not_batched": (
        "touches no server (an unconnected cluster client); it already runs once"
    ),
}

globals().update(single_server_tests(single_server, exclude=EXCLUDED))
