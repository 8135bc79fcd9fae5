"""How a command that found nothing says where else to look (the wording, no server)."""

from __future__ import annotations

from canon.commands.readonly import where_else
from eventstore.audit.namespaces import OtherNamespaces
from eventstore.wire.keys import RUNS_OF_ANY_NAMESPACE, Keys, run_key_of_any_namespace


def found(
    holding: tuple[str, ...] = (), runs: tuple[str, ...] = (), complete: bool = True
) -> OtherNamespaces:
    """A search result with these namespaces."""
    return OtherNamespaces(
        holding_run=holding, with_runs=runs, complete=complete, keys_bound=100_000
    )


def test_the_run_asked_about_is_pointed_to_first() -> None:
    """One namespace holding the run: its name and the flag; several: their names."""
    assert where_else(found(("demo",), ("demo", "prod")), "r1") == (
        "; run r1 is in namespace demo: add --namespace demo"
    )
    assert where_else(found(("a", "b"), ("a", "b")), "r1") == (
        "; run r1 is in namespaces a, b: add --namespace with one of them"
    )


def test_a_run_held_nowhere_else_names_the_namespaces_with_runs() -> None:
    """The run is in no other namespace: say so, and which ones hold runs."""
    assert where_else(found((), ("demo",)), "r1") == (
        "; run r1 is in no other namespace either (runs exist in namespace demo)"
    )
    assert where_else(found((), ("a", "b")), "r1").endswith("(runs exist in namespaces a, b)")


def test_without_a_run_the_namespaces_with_runs_are_named_and_counted_past_five() -> None:
    """The first five names are listed, the rest counted."""
    assert where_else(found((), ("demo",))) == (
        "; runs exist in namespace demo: add --namespace demo"
    )
    many = tuple(f"ns{i}" for i in range(8))
    assert where_else(found((), many)) == (
        "; runs exist in namespaces ns0, ns1, ns2, ns3, ns4 and 3 more: add --namespace with "
        "one of them"
    )


def test_nothing_is_added_unless_a_search_that_stopped_early_found_nothing() -> None:
    """A whole search that found nothing adds nothing; one the bound stopped says so."""
    assert where_else(found(), "r1") == ""
    assert where_else(found()) == ""
    assert where_else(found(complete=False)) == (
        "; no other namespace with runs among the first 100000 keys searched"
    )
    assert where_else(found(("demo",), ("demo",), complete=False), "r1").endswith(
        "add --namespace demo (searched the first 100000 keys only)"
    )


def test_run_keys_of_any_namespace_are_read_back_and_nothing_else() -> None:
    """Run hashes and run indexes name their namespace (and run); other keys, and names
    no namespace can have, are not read as one."""
    keys = Keys("demo", 16)
    assert run_key_of_any_namespace(keys.run("billing-1")) == ("demo", "billing-1")
    assert run_key_of_any_namespace(keys.run_index(3).encode()) == ("demo", None)
    for other in (
        keys.record("r1", "c:{s01}:run:x"),
        keys.refusals("r1"),
        keys.meta(),
        "a:b:{s01}:runs",
        "demo:{s01}:runsx",
        "demo:{s01}:run:bad id",
    ):
        assert run_key_of_any_namespace(other) is None, other
    assert RUNS_OF_ANY_NAMESPACE == "*:{s*}:run*"
