"""The Redis server itself: finding and running one, and checking how it is set up.

:mod:`.binaries` finds a ``redis-server`` by version; :class:`EmbeddedRedis`
(:mod:`.embedded`) runs a private one, for tests, demos and single-machine use
(:mod:`.loopback` asks a just-started server who it is). :mod:`.settings` reads the server
settings that decide what an invocation costs and :mod:`.durability` whether the server
could lose or evict what the store commits.
"""

from eventstore.server.embedded import EmbeddedRedis

__all__ = ["EmbeddedRedis"]
