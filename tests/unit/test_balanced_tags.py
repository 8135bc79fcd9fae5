"""Balanced shard tags (layout 3): evenly spaced hash slots, so equal masters get equal shares."""

from __future__ import annotations

import fnmatch
from collections import Counter

import pytest
from redis.crc import key_slot

from eventstore.wire.keys import (
    BALANCED_TAGS_48,
    DEFAULT_SHARDS,
    LAYOUT,
    PLAIN_TAG_LAYOUT,
    RUNS_OF_ANY_NAMESPACE,
    SLOTS,
    InvocationKey,
    Keys,
    balanced_tag,
    balanced_tags,
    run_key_of_any_namespace,
)


def slot_of_tag(tag: str) -> int:
    """The slot Redis gives any key holding ``{tag}``, computed by redis-py's CRC16."""
    return key_slot(f"{{{tag}}}:anything".encode())


def redis_cli_ranges(masters: int) -> list[range]:
    """The contiguous slot ranges ``redis-cli --cluster create`` gives ``masters`` masters."""
    per_master = SLOTS / masters
    ranges, first, cursor = [], 0, 0.0
    for index in range(masters):
        last = round(cursor + per_master - 1)
        if last > SLOTS or index == masters - 1:
            last = SLOTS - 1
        ranges.append(range(first, max(last, first) + 1))
        first, cursor = max(last, first) + 1, cursor + per_master
    return ranges


def shares(tags: tuple[str, ...], masters: int) -> list[float]:
    """The share of ``tags`` each of ``masters`` equal contiguous masters serves."""
    ranges = redis_cli_ranges(masters)
    owners = Counter(
        next(i for i, slots in enumerate(ranges) if slot_of_tag(tag) in slots) for tag in tags
    )
    return [owners[i] / len(tags) for i in range(masters)]


def test_the_fixed_table_is_the_search_result_for_the_default_shard_count() -> None:
    """BALANCED_TAGS_48 is exactly what balanced_tag finds: the table and its search agree."""
    assert DEFAULT_SHARDS == len(BALANCED_TAGS_48) == 48
    assert tuple(balanced_tag(shard, 48) for shard in range(48)) == BALANCED_TAGS_48
    assert balanced_tags(48) is BALANCED_TAGS_48


@pytest.mark.parametrize("shards", [1, 5, 16, 48, 96, 256])
def test_tag_k_sits_within_a_quarter_step_of_the_middle_of_its_slice(shards: int) -> None:
    """Tag k's slot (CRC16, recomputed by redis-py) is near k * 16384 / shards + half a step."""
    tags = BALANCED_TAGS_48 if shards == 48 else balanced_tags(shards)
    step = SLOTS / shards
    for shard, tag in enumerate(tags):
        assert tag.startswith(f"s{shard:02d}.")
        assert abs(slot_of_tag(tag) - (shard + 0.5) * step) <= step / 4 + 1
    slots = [slot_of_tag(tag) for tag in tags]
    assert slots == sorted(slots)


@pytest.mark.parametrize("masters", [3, 4, 6, 8, 12, 16])
def test_equal_contiguous_masters_dividing_48_serve_exactly_equal_shares(masters: int) -> None:
    """On N masters with equal contiguous slot ranges each serves exactly 1/N of the shards."""
    assert shares(BALANCED_TAGS_48, masters) == [1 / masters] * masters


@pytest.mark.parametrize("masters", [5, 7])
def test_other_master_counts_stay_within_five_points_of_an_equal_share(masters: int) -> None:
    """When N does not divide 48, no master serves more than 1/N + 0.05 of the shards."""
    assert max(shares(BALANCED_TAGS_48, masters)) <= 1 / masters + 0.05


def test_the_plain_tags_of_layout_2_are_what_made_this_necessary() -> None:
    """The 16 plain tags {s00}..{s15} put ~0.47 of the shards on one of three masters."""
    plain = tuple(f"s{shard:02d}" for shard in range(16))
    assert max(shares(plain, 3)) > 0.45


def test_layout_3_keys_keep_the_documented_patterns_and_parse_back() -> None:
    """Balanced tags still start with '{s', so '{s*}' ACL and SCAN patterns match them."""
    keys = Keys("ns", 48)
    assert keys.layout == LAYOUT
    run_key, index = keys.run("run-1"), keys.run_index(5)
    assert keys.tag_of("run-1").startswith("ns:{s")
    for key in (run_key, index):
        assert fnmatch.fnmatchcase(key, RUNS_OF_ANY_NAMESPACE)
    assert run_key_of_any_namespace(run_key) == ("ns", "run-1")
    assert run_key_of_any_namespace(index) == ("ns", None)
    assert fnmatch.fnmatchcase(keys.feed(47), "ns:{s*}:feed")
    record, stream = keys.record("run-1", "a:{b}"), keys.stream("run-1", "a:{b}")
    assert keys.parse_invocation_key(record) == InvocationKey("record", "run-1", "a:{b}", True)
    assert keys.parse_invocation_key(stream) == InvocationKey("stream", "run-1", "a:{b}", True)
    pattern = keys.invocation_scan_pattern("run-1")
    assert fnmatch.fnmatchcase(record, pattern) and fnmatch.fnmatchcase(stream, pattern)


def test_every_key_of_a_run_shares_the_balanced_tags_slot() -> None:
    """All keys of one run carry one tag, so one script still touches them on a cluster."""
    keys = Keys("ns", 48)
    invocation = keys.invocation("run-9", "call-1")
    slots = {key_slot(getattr(invocation, name).encode()) for name in invocation.__slots__}
    assert len(slots) == 1


def test_a_plain_tag_namespace_keeps_its_tags() -> None:
    """A layout 2 namespace of 16 shards is written exactly as before: {sNN}."""
    assert Keys("ns", 16, PLAIN_TAG_LAYOUT).tag(7) == "ns:{s07}"
    assert Keys("ns", 16).tag(7) == f"ns:{{{balanced_tags(16)[7]}}}"
