"""Acknowledged replication: an append counts as committed only once N replicas have it.

With ``Store.from_url(..., replicas=N, replica_timeout_ms=T)`` every append is sent as
``EVALSHA`` followed by ``WAIT N T`` on the same connection. WAIT must run on the
connection that wrote: it waits for the replication offset of that connection's last
write. An append that fewer than N replicas acknowledged within T raises
:class:`ReplicationTimeout` (a :class:`StoreUnavailable`), which the boundary answers as
STORE_UNAVAILABLE: never a silent success. The event did reach the primary; a retry of the
same event id is answered as already applied, as after any lost reply.

Where batching meets WAIT: :class:`eventstore.wire.batching.ScriptBatcher` sends each
pipeline on the connection of the lane that took it; one ``WAIT`` appended to the end of
that pipeline (same connection, after the last EVALSHA) would acknowledge the whole batch
at the cost of one command. Until the batcher offers that hook, replicated stores send each
append on its own (:class:`ReplicaAcknowledgedCalls`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError
from redis.typing import EncodableT, KeyT

from eventstore.errors import InvalidArgument, StoreUnavailable
from eventstore.wire.batching import ScriptBatcher, Sent
from eventstore.wire.replies import reply_text

DEFAULT_REPLICA_TIMEOUT_MS: Final = 500


class ReplicationTimeout(StoreUnavailable):
    """Raised when an append reached the primary but too few replicas acknowledged it.

    The event may still be lost if the primary fails before its replicas catch up, so the
    caller must treat the append as not durably committed.
    """

    def __init__(self, acknowledged: int, required: int) -> None:
        super().__init__(f"ReplicationTimeout {acknowledged}/{required}")
        self.acknowledged = acknowledged
        self.required = required


def validate_replicas(
    replicas: int, replica_timeout_ms: int, *, timeout_s: float, cluster: bool
) -> None:
    """Check a store's WAIT settings.

    Raises:
        InvalidArgument: ``replicas`` is negative, the timeout is not below the command
            timeout (the socket would time out first), or the client is a cluster client.

    """
    if replicas < 0:
        raise InvalidArgument("replicas must not be negative")
    if replicas and cluster:
        raise InvalidArgument("replicas (WAIT) is not supported with a Redis Cluster client")
    if replicas and not 0 < replica_timeout_ms < timeout_s * 1000:
        raise InvalidArgument("replica_timeout_ms must be positive and below the command timeout")


def _refused(reply: Any) -> bool:
    return isinstance(reply, list) and bool(reply) and reply_text(reply[0]) == "refused"


class ReplicaAcknowledgedCalls(ScriptBatcher):
    """Script calls acknowledged only after ``replicas`` replicas have their writes.

    Each call is one pipeline on one pooled connection: ``EVALSHA`` then ``WAIT replicas
    timeout_ms``. WAIT must follow the write on the same connection, so these calls are
    not coalesced with others (a batcher could append one WAIT to each whole pipeline).
    A refused script wrote nothing, so its reply is returned whatever WAIT says.

    Args:
        client: the store's client (single server).
        replicas: how many replicas must acknowledge each write.
        timeout_ms: how long WAIT may block.

    """

    def __init__(self, client: Redis, *, replicas: int, timeout_ms: int) -> None:
        super().__init__(client)
        self._redis = client
        self.replicas = replicas
        self.timeout_ms = timeout_ms

    def __repr__(self) -> str:
        return f"<ReplicaAcknowledgedCalls replicas={self.replicas} calls={self.stats.calls}>"

    async def call(
        self, script: AsyncScript, keys: Sequence[KeyT], args: Iterable[EncodableT]
    ) -> Any:
        """Run ``script`` and wait for the replicas; see the class docstring.

        Raises:
            ReplicationTimeout: fewer than ``replicas`` replicas acknowledged in time.
            redis.exceptions.RedisError: the script's error reply, or a connection error.

        """
        self.stats.calls += 1
        self.stats.waits += 1
        arguments = (len(keys), *keys, *args)
        reply, acknowledged = await self._round_trip_with_wait(script, arguments)
        if isinstance(reply, NoScriptError):
            script.sha = await self._redis.script_load(script.script)
            self.stats.reloads += 1
            reply, acknowledged = await self._round_trip_with_wait(script, arguments)
        if isinstance(reply, Exception):
            raise reply
        if not _refused(reply) and int(acknowledged) < self.replicas:
            raise ReplicationTimeout(int(acknowledged), self.replicas)
        return reply

    async def send(
        self, script: AsyncScript, keys: Sequence[KeyT], args: Iterable[EncodableT]
    ) -> Sent:
        """Run ``script`` and wait for the replicas now, as :meth:`call` does.

        A write that must be acknowledged is answered before anything follows it.

        Raises:
            ReplicationTimeout: as for :meth:`call`.
            redis.exceptions.RedisError: as for :meth:`call`.

        """
        return Sent(self, None, replies=[await self.call(script, keys, args)])

    async def _round_trip_with_wait(
        self, script: AsyncScript, arguments: tuple[EncodableT, ...]
    ) -> tuple[Any, Any]:
        self.stats.round_trips += 1
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.evalsha(script.sha, *arguments)  # type: ignore[arg-type]
            pipe.execute_command("WAIT", self.replicas, self.timeout_ms)
            reply, acknowledged = await pipe.execute(raise_on_error=False)
        if isinstance(acknowledged, Exception):
            raise acknowledged
        return reply, acknowledged
