"""How bytes reach Redis: keys, Lua scripts and their typed wrappers, batching, replies.

:mod:`.keys` is the only code that formats a key (its docstring is the table of every
key, its type, its writer and its TTL). :mod:`.lua` loads the Lua scripts of every
package; :mod:`.scripts` wraps each of the store's scripts (``scripts/*.lua``) in one
typed class. :mod:`.batching` groups the script calls of one event-loop turn into one
round trip, :mod:`.exchange` sends them on one connection and :mod:`.pipe` reads the
replies; :mod:`.replies` decodes reply values. :mod:`.deadlines` bounds each await with
one shared timer, :mod:`.replication` makes an append wait for its replicas, and
:mod:`.cluster` is the client a store uses on a Redis Cluster, where
:mod:`.cluster_batching` runs one batcher per primary and routes each call by its slot.
"""
