"""Every exception the packages define sits under one root, CanonError, and says when it
is raised; the root is importable from machine and from eventstore alike."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil

import pytest

import canon
import eventstore
import machine
import projections
from eventstore import errors
from machine.errors import CanonError, InvalidArgument
from tests.unit.test_base_install_imports_no_sdk import STACK_ADAPTERS

PACKAGES = (machine, eventstore, projections, canon)
#: The adapters whose SDKs live in virtualenvs of their own (tests/stacks): importing them
#: here fails by design (test_base_install_imports_no_sdk); they define no exception.
ELSEWHERE = {module for module, _, sdk in STACK_ADAPTERS if importlib.util.find_spec(sdk) is None}


def defined_exceptions() -> list[type[BaseException]]:
    """Every public exception class defined (not imported) in one of our modules."""
    found: list[type[BaseException]] = []
    for package in PACKAGES:
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if info.name in ELSEWHERE:
                continue
            module = importlib.import_module(info.name)
            for name, value in vars(module).items():
                if (
                    inspect.isclass(value)
                    and issubclass(value, BaseException)
                    and value.__module__ == module.__name__
                    and not name.startswith("_")
                ):
                    found.append(value)
    return found


EXCEPTIONS = defined_exceptions()


def test_the_walk_finds_the_exceptions_named_in_the_issue() -> None:
    """The check below cannot pass vacuously: it sees the classes it is about."""
    names = {cls.__name__ for cls in EXCEPTIONS}
    assert {
        "FoldError",
        "EmbeddedRedisError",
        "GroupMissing",
        "MalformedEntry",
        "ConnectionSettingsError",
        "StoreUnavailable",
    } <= names


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=lambda cls: f"{cls.__module__}.{cls.__name__}")
def test_every_exception_is_under_the_root_and_says_when_it_is_raised(
    cls: type[BaseException],
) -> None:
    """Catching CanonError catches it; its docstring starts with "Raised when"."""
    assert issubclass(cls, CanonError)
    if cls is not CanonError:
        assert (cls.__doc__ or "").startswith("Raised when"), cls.__doc__


def test_the_root_is_one_class_whichever_package_it_is_imported_from() -> None:
    """machine defines it (machine imports nothing of ours); eventstore re-exports it."""
    assert errors.CanonError is CanonError is eventstore.CanonError
    assert errors.InvalidArgument is InvalidArgument
    assert issubclass(InvalidArgument, ValueError)
