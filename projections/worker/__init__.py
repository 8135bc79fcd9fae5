"""The worker runtime: consumer groups over the shard feeds, and keeping them healthy.

:mod:`.runtime` is one consumer of one projection's group on every shard feed it owns;
:mod:`.groups` issues the consumer-group commands, :mod:`.handling` settles delivered
entries (apply, count, dead-letter), :mod:`.failures` keeps the last failure reason of an
entry, :mod:`.upkeep` runs the periodic duties, :mod:`.lag` measures lag and trims the
feeds, :mod:`.outage` waits out a Redis outage and :mod:`.supervisor` runs workers and
the receipt server in one program.
"""
