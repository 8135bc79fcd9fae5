"""The root of the package's error hierarchy, defined here so that ``machine`` can use it.

Dependencies point one way (``machine`` <- ``eventstore`` <- ``projections`` <- ``canon``),
so the root lives in the package everything else imports: the fold's errors derive from
it here, and :mod:`eventstore.errors` re-exports it as ``eventstore.errors.CanonError``
for everything built on the store.
"""

from __future__ import annotations


class CanonError(Exception):
    """Root of every error the store, its projections and its command raise.

    Raised as such never; catch it to handle any of them.
    """


class InvalidArgument(CanonError, ValueError):
    """Raised when a caller passes an id, limit or setting the store cannot accept.

    It is also a ``ValueError``, as an invalid argument is in the standard library.
    """
