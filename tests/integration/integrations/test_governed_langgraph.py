"""canon.integrations.langgraph with a governed tool: the call interrupts a real
checkpointed graph until canon's operator decides; a resume, whatever its value, only asks
canon again; the approved call runs once across resumes, re-runs and forks; a denial
reaches the model as LangGraph's error ToolMessage. Sync and async, driven by a scripted
chat model.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command, Interrupt

from canon.integrations.langchain import as_tools
from canon.integrations.langgraph import tool_node
from eventstore import Projection, SyncBoundary, SyncStore, ToolBoundary, ToolCall, ToolSpec
from eventstore.writer import now_ms
from machine.codes import SAFE_MESSAGES, ErrorCode, Stage, Status
from tests.support.chat_models import ScriptedChatModel
from tests.support.waiting import wait_for

THREAD = "thread-gov-1"
CONFIG: RunnableConfig = {"configurable": {"thread_id": THREAD}}
QUESTION = {"messages": [("user", "Refund order A-17 and find the refund policy.")]}
REFUND_ARGS: dict[str, Any] = {"order": "A-17", "amount": 125}
#: (tool call id, tool, args), as the scripted model calls them.
Call = tuple[str, str, dict[str, Any]]
REFUND: Call = ("call_Rf7uNd0a1B2c3D4e", "refund", REFUND_ARGS)
SEARCH: Call = ("call_S3arCh5f6G7h8I9j", "search", {"q": "refund"})
#: One model turn: a governed call and a read-only one, run in parallel by one node.
TURN: list[Call] = [REFUND, SEARCH]


class Shop:
    """A governed refund tool and a read-only search, counting every run (any thread)."""

    def __init__(self, approval_timeout: timedelta = timedelta(hours=1)) -> None:
        self._lock = threading.Lock()
        self.runs: dict[str, int] = {}
        self.approval_timeout = approval_timeout

    def _count(self, call: ToolCall) -> None:
        with self._lock:
            self.runs[call.tool_call_id] = self.runs.get(call.tool_call_id, 0) + 1

    def refund(self, arguments: dict[str, Any], call: ToolCall) -> dict[str, Any]:
        """Move money: the side effect that must happen at most once."""
        self._count(call)
        return {"refunded": arguments["amount"], "order": arguments["order"]}

    def search(self, arguments: dict[str, Any], call: ToolCall) -> dict[str, Any]:
        """Read the knowledge base."""
        self._count(call)
        return {"hits": [f"{arguments['q']} policy"]}

    def specs(self) -> dict[str, ToolSpec]:
        """``refund`` waits for an operator's approval; ``search`` is read-only."""
        return {
            "refund": ToolSpec(
                executor=self.refund,
                projector=as_found,
                read_only=False,
                approval=True,
                approval_timeout=self.approval_timeout,
                description="Refund an order.",
                input_schema={
                    "type": "object",
                    "properties": {"order": {"type": "string"}, "amount": {"type": "integer"}},
                },
            ),
            "search": ToolSpec(
                executor=self.search,
                projector=as_found,
                description="Search the knowledge base.",
                input_schema={"type": "object", "properties": {"q": {"type": "string"}}},
            ),
        }


def as_found(raw: Any, call: ToolCall) -> Projection:
    """The tool's result as the agent's result."""
    return Projection(result=raw, evidence_status="EVIDENCE_FOUND", scope="shop")


REFUNDED = {"refunded": 125, "order": "A-17"}
FOUND = {"hits": ["refund policy"]}


def build_graph(
    model: ScriptedChatModel, boundary: ToolBoundary | SyncBoundary, specs: dict[str, ToolSpec]
) -> Any:
    """model -> tools -> model, checkpointed; the tools node is canon's ``tool_node``."""
    tools = as_tools(boundary, specs)
    return compile_graph(model.bind_tools(tools), tool_node(boundary, tools))


def compile_graph(agent: Any, node: Any) -> Any:
    """The usual agent loop over ``node``, with an in-memory checkpointer."""

    def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [agent.invoke(state["messages"])]}

    async def acall_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await agent.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", RunnableLambda(call_model, afunc=acall_model))
    builder.add_node("tools", node)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=InMemorySaver())


def tool_messages(state: Any) -> dict[str, ToolMessage]:
    """The state's tool messages by tool call id."""
    return {m.tool_call_id: m for m in state["messages"] if isinstance(m, ToolMessage)}


def answers(state: Any) -> dict[str, tuple[str, str, Any]]:
    """What the model is shown for each call: (tool, status, content); the messages' own
    ids are the graph's, new for each run of the node."""
    return {c: (m.name or "", m.status, m.content) for c, m in tool_messages(state).items()}


def shown(message: ToolMessage) -> Any:
    """What the model reads in a ToolMessage."""
    return json.loads(message.content)  # type: ignore[arg-type]


def the_interrupt(state: Any) -> Interrupt:
    """The one interrupt the graph stopped with."""
    [stopped] = state["__interrupt__"]
    assert isinstance(stopped, Interrupt)
    return stopped


class Driver:
    """Runs one graph the way the test's mode says: ``invoke`` or ``ainvoke``."""

    def __init__(self, graph: Any, mode: str) -> None:
        self.graph = graph
        self.mode = mode

    async def run(self, value: Any, config: RunnableConfig = CONFIG) -> Any:
        """Run the graph from ``config``'s checkpoint with ``value`` (input, Command, None)."""
        if self.mode == "sync":
            return self.graph.invoke(value, config)
        return await self.graph.ainvoke(value, config)

    async def state(self, config: RunnableConfig = CONFIG) -> Any:
        """The graph's state snapshot at ``config``."""
        if self.mode == "sync":
            return self.graph.get_state(config)
        return await self.graph.aget_state(config)

    async def history(self) -> list[Any]:
        """The thread's checkpoints, newest first."""
        if self.mode == "sync":
            return list(self.graph.get_state_history(CONFIG))
        return [snapshot async for snapshot in self.graph.aget_state_history(CONFIG)]

    async def update(self, config: RunnableConfig, values: Any, as_node: str) -> RunnableConfig:
        """Fork: a new checkpoint after ``config``'s, as if ``as_node`` wrote ``values``."""
        forked: RunnableConfig
        if self.mode == "sync":
            forked = self.graph.update_state(config, values, as_node=as_node)
        else:
            forked = await self.graph.aupdate_state(config, values, as_node=as_node)
        return forked


class Operators:
    """Canon's operators, deciding through the store (sync or async alike)."""

    def __init__(self, decide: Callable[..., Any]) -> None:
        self._decide = decide

    async def decide(self, call_id: str, *, approve: bool) -> None:
        """Approve or deny the call, as an operator; the first decision."""
        decision = self._decide(
            THREAD, call_id, approve=approve, by="ops@example", reason="checked the order"
        )
        if isinstance(decision, Awaitable):
            decision = await decision
        assert decision.made_now


@pytest.fixture
def sync_store(redis_url: str, namespace: str) -> Iterator[SyncStore]:
    """A SyncStore with the test's thread open as a run; closed after the test."""
    with SyncStore.from_url(redis_url, namespace=namespace) as store:
        store.open_run(THREAD, deadline=timedelta(minutes=5))
        yield store


MODES = ["sync", "async-tool-boundary", "async-sync-boundary"]


@pytest.fixture(params=MODES)
async def setup(
    request: pytest.FixtureRequest, sync_store: SyncStore, make_open_store: Any
) -> Callable[..., Any]:
    """A factory of (driver, shop, model, operators, records) for the test's mode:
    ``graph.invoke`` with a SyncBoundary, ``graph.ainvoke`` with a ToolBoundary on the
    test's loop, or ``graph.ainvoke`` with a SyncBoundary."""
    mode: str = request.param
    # The run is open already: sync_store opened it in this namespace.
    store = await make_open_store() if mode == "async-tool-boundary" else None

    def make(shop: Shop | None = None, calls: list[Call] = TURN) -> Any:
        shop = shop or Shop()
        model = ScriptedChatModel(calls=list(calls))
        boundary: ToolBoundary | SyncBoundary
        if store is not None:
            boundary = ToolBoundary(store, shop.specs())
            operators = Operators(store.decide)
            records: Any = store
        else:
            boundary = SyncBoundary(sync_store, shop.specs())
            operators = Operators(sync_store.decide)
            records = sync_store
        graph = build_graph(model, boundary, shop.specs())
        return Driver(graph, "sync" if mode == "sync" else "async"), shop, model, operators, records

    return make


async def record_of(records: Any, call_id: str) -> Any:
    """The call's canonical record, from a SyncStore or a Store."""
    record = records.get(THREAD, call_id)
    return await record if isinstance(record, Awaitable) else record


async def wait_for_status(records: Any, call_id: str) -> None:
    """Wait until the call's record has its outcome (READY or ERROR)."""

    async def ended() -> bool:
        record = await record_of(records, call_id)
        return record is not None and record.state.status is not Status.PROJECTING

    await wait_for(ended)


async def journal_of(records: Any, call_id: str) -> list[str]:
    """The types of the call's recorded events, in order."""
    stored = records.events(THREAD, call_id)
    stored = await stored if isinstance(stored, Awaitable) else stored
    return [type(entry.event).__name__ for entry in stored]


async def test_a_governed_call_interrupts_the_graph_with_its_approval_request(
    setup: Callable[..., Any],
) -> None:
    """The refund waits for an operator: the graph stops at the tools node with
    ``{"type": "tool_approval", ...}``; the refund has not run and the model has not
    been shown anything; the read-only call of the same node ran at most once (LangGraph
    cancels a call of the node that had not started when another interrupts: it runs on
    the resume, see the approval tests)."""
    driver, shop, model, _, records = setup()
    state = await driver.run(QUESTION)
    stopped = the_interrupt(state)
    record = await record_of(records, REFUND[0])
    assert record is not None and record.state.stage is Stage.AWAITING_APPROVAL
    assert stopped.value == {
        "type": "tool_approval",
        "run_id": THREAD,
        "tool_call_id": REFUND[0],
        "approval_id": record.state.approval_id,
        "name": "refund",
        "args": REFUND_ARGS,
    }
    assert (await driver.state()).next == ("tools",)
    assert REFUND[0] not in shop.runs
    assert len(model.requests) == 1 and tool_messages(state) == {}
    assert shop.runs.get(SEARCH[0], 0) <= 1


@pytest.mark.parametrize("resume", [{"approved": True}, True, "approve", {"decision": "yes"}])
async def test_the_graphs_own_approval_never_runs_the_call(
    setup: Callable[..., Any], resume: Any
) -> None:
    """``Command(resume=...)`` with any value and no decision in canon: the node asks
    canon again, the call still waits, the graph interrupts again, nothing ran; the
    approval was requested once however often the graph came back."""
    driver, shop, model, _, records = setup()
    first = the_interrupt(await driver.run(QUESTION))
    for _ in range(3):
        again = the_interrupt(await driver.run(Command(resume=resume)))
        assert again.value == first.value
        assert (await driver.state()).next == ("tools",)
    assert REFUND[0] not in shop.runs and len(model.requests) == 1
    record = await record_of(records, REFUND[0])
    assert record.state.stage is Stage.AWAITING_APPROVAL
    assert record.state.approval_id == first.value["approval_id"]
    assert await journal_of(records, REFUND[0]) == ["ApprovalRequested"]
    assert shop.runs.get(SEARCH[0]) == 1


async def test_an_operator_approval_runs_the_call_once_on_resume(
    setup: Callable[..., Any],
) -> None:
    """Approved in canon, the graph's resume runs the refund once; the read-only call is
    answered from its record; the model is shown both results and answers."""
    driver, shop, model, operators, records = setup()
    await driver.run(QUESTION)
    await driver.run(Command(resume="nudge"))  # still waiting: interrupts again
    await operators.decide(REFUND[0], approve=True)
    state = await driver.run(Command(resume={"approved": False}))  # the value is not read
    assert "__interrupt__" not in state
    assert shop.runs == {REFUND[0]: 1, SEARCH[0]: 1}
    answered = tool_messages(state)
    assert [answered[c].status for c, _, _ in TURN] == ["success", "success"]
    assert shown(answered[REFUND[0]]) == REFUNDED
    assert shown(answered[SEARCH[0]]) == FOUND
    assert state["messages"][-1].content == "2 tool results"
    assert {m.tool_call_id for m in model.tool_results_seen()} == {REFUND[0], SEARCH[0]}
    record = await record_of(records, REFUND[0])
    assert record.state.status is Status.READY and record.state.decided_by == "ops@example"
    journal = await journal_of(records, REFUND[0])
    assert [journal.count(t) for t in ("ApprovalRequested", "Approved", "Dispatched")] == [1, 1, 1]


async def test_resumes_reruns_and_forks_get_the_recorded_outcome(
    setup: Callable[..., Any],
) -> None:
    """After the approved refund ran: resuming the interrupted checkpoint again (a second
    resume, or a harness restarted from its last checkpoint), re-running the tools node
    from the checkpoint before it (time travel) and a fork made with ``update_state``
    all get the same ToolMessages; the refund never runs twice. A fork that edits the
    call's arguments under its id runs nothing: DUPLICATE_TOOL_CALL."""
    driver, shop, _, operators, _ = setup()
    await driver.run(QUESTION)
    await operators.decide(REFUND[0], approve=True)
    done = answers(await driver.run(Command(resume=True)))
    before_tools = [s for s in await driver.history() if s.next == ("tools",)]
    assert before_tools
    for snapshot in before_tools:
        value: Command[Any] | None
        for value in (Command(resume=True), None):
            assert answers(await driver.run(value, snapshot.config)) == done
    ask = next(m for m in before_tools[0].values["messages"] if isinstance(m, AIMessage))
    same = await driver.update(before_tools[-1].config, {"messages": [ask]}, "model")
    assert answers(await driver.run(None, same)) == done
    edited_call = {**ask.tool_calls[0], "args": {"order": "A-17", "amount": 9_999}}
    edited = ask.model_copy(update={"tool_calls": [edited_call, ask.tool_calls[1]]})
    fork = await driver.update(before_tools[-1].config, {"messages": [edited]}, "model")
    refused = tool_messages(await driver.run(None, fork))[REFUND[0]]
    assert refused.status == "error"
    assert shown(refused)["error_code"] == ErrorCode.DUPLICATE_TOOL_CALL.value
    assert shop.runs == {REFUND[0]: 1, SEARCH[0]: 1}


async def test_a_denial_reaches_the_model_as_an_error_tool_message(
    setup: Callable[..., Any],
) -> None:
    """Denied in canon, the resume answers the refund with LangGraph's error form
    (``status="error"``, the safe APPROVAL_DENIED JSON); the refund never runs, the
    model is shown the denial and goes on; later re-runs get the same denial."""
    driver, shop, model, operators, records = setup()
    await driver.run(QUESTION)
    await operators.decide(REFUND[0], approve=False)
    state = await driver.run(Command(resume={"approved": True}))
    denied = tool_messages(state)[REFUND[0]]
    assert (denied.status, denied.name) == ("error", "refund")
    code = ErrorCode.APPROVAL_DENIED
    assert shown(denied) == {"error_code": code.value, "message": SAFE_MESSAGES[code]}
    assert denied in model.tool_results_seen()
    assert state["messages"][-1].content == "2 tool results"
    [before_tools, *_] = [s for s in await driver.history() if s.next == ("tools",)]
    rerun = answers(await driver.run(None, before_tools.config))[REFUND[0]]
    assert rerun == ("refund", "error", denied.content)
    assert REFUND[0] not in shop.runs
    record = await record_of(records, REFUND[0])
    assert record.state.status is Status.ERROR and record.state.error_code is code


async def test_an_approval_that_expired_answers_approval_expired(
    setup: Callable[..., Any],
) -> None:
    """Nobody decided in time: the resume answers APPROVAL_EXPIRED as an error message."""
    driver, shop, _, _, records = setup(Shop(approval_timeout=timedelta(milliseconds=50)))
    await driver.run(QUESTION)
    record = await record_of(records, REFUND[0])
    due = record.state.approval_expires_at_ms
    await wait_for(lambda: now_ms() > due)
    expired = tool_messages(await driver.run(Command(resume=True)))[REFUND[0]]
    assert expired.status == "error"
    assert shown(expired)["error_code"] == ErrorCode.APPROVAL_EXPIRED.value
    assert REFUND[0] not in shop.runs


async def test_two_waiting_calls_of_one_node_run_once_each_after_one_resume(
    setup: Callable[..., Any],
) -> None:
    """Two governed calls in one turn: LangGraph shows one interrupt (a ToolNode stops at
    the first), canon lists both; approved, one resume asks canon for each and runs each
    once; one approved and one still waiting, the approved one runs and the other
    interrupts again."""
    second: Call = ("call_Rf7uNd0a1B2c3D4f", "refund", {"order": "B-2", "amount": 7})
    driver, shop, _, operators, records = setup(calls=[REFUND, second, SEARCH])
    stopped = the_interrupt(await driver.run(QUESTION))
    assert stopped.value["tool_call_id"] in {REFUND[0], second[0]}
    for call_id in (REFUND[0], second[0]):
        record = await record_of(records, call_id)
        assert record.state.stage is Stage.AWAITING_APPROVAL
    await operators.decide(REFUND[0], approve=True)
    again = the_interrupt(await driver.run(Command(resume=True)))
    assert again.value["tool_call_id"] == second[0]
    # The node's calls run concurrently: the interrupt of the waiting one may end the
    # graph's turn while the approved one still runs (LangGraph leaves it running).
    await wait_for_status(records, REFUND[0])
    assert shop.runs.get(REFUND[0]) == 1 and second[0] not in shop.runs
    await operators.decide(second[0], approve=True)
    state = await driver.run(Command(resume=True))
    assert shop.runs == {REFUND[0]: 1, second[0]: 1, SEARCH[0]: 1}
    assert shown(tool_messages(state)[second[0]]) == {"refunded": 7, "order": "B-2"}
    assert shown(tool_messages(state)[REFUND[0]]) == REFUNDED


def test_langgraphs_own_tool_node_over_canon_tools_interrupts_too(sync_store: SyncStore) -> None:
    """``as_tools`` in LangGraph's plain ``ToolNode`` (as prebuilt agents use them): the
    governed tool interrupts the same way, and runs once when canon approves."""
    shop, model = Shop(), ScriptedChatModel(calls=list(TURN))
    boundary = SyncBoundary(sync_store, shop.specs())
    tools = as_tools(boundary, shop.specs())
    graph = compile_graph(model.bind_tools(tools), ToolNode(tools))
    stopped = the_interrupt(graph.invoke(QUESTION, CONFIG))
    assert stopped.value["type"] == "tool_approval"
    assert stopped.value["tool_call_id"] == REFUND[0]
    assert "__interrupt__" in graph.invoke(Command(resume={"approved": True}), CONFIG)
    assert REFUND[0] not in shop.runs
    sync_store.decide(THREAD, REFUND[0], approve=True, by="ops@example", reason="ok")
    state = graph.invoke(Command(resume=True), CONFIG)
    assert shown(tool_messages(state)[REFUND[0]]) == REFUNDED
    assert shop.runs == {REFUND[0]: 1, SEARCH[0]: 1}


async def test_outside_a_graph_the_tool_answers_that_the_call_waits(
    sync_store: SyncStore,
) -> None:
    """Called directly (no graph to interrupt), the governed tool's ToolMessage says the
    call waits for approval and has not run; called again once approved, it runs once."""
    shop = Shop()
    [refund, _] = as_tools(SyncBoundary(sync_store, shop.specs()), shop.specs())
    call = {"type": "tool_call", "id": REFUND[0], "name": "refund", "args": REFUND_ARGS}
    for waiting in (refund.invoke(call, CONFIG), await refund.ainvoke(call, CONFIG)):
        assert waiting.status == "success"
        assert shown(waiting)["status"] == "awaiting_approval"
    assert REFUND[0] not in shop.runs
    sync_store.decide(THREAD, REFUND[0], approve=True, by="ops@example", reason="ok")
    assert shown(refund.invoke(call, CONFIG)) == REFUNDED
    assert shown(await refund.ainvoke(call, CONFIG)) == REFUNDED
    assert shop.runs == {REFUND[0]: 1}


async def maybe_await(value: Any) -> Any:
    """A SyncStore's answer as it is, a Store's awaited."""
    return await value if isinstance(value, Awaitable) else value


async def test_a_pause_holds_an_approved_call_until_the_unpause(
    setup: Callable[..., Any],
) -> None:
    """Approved, then the run paused: the graph's resume interrupts again on the same call
    (no error ToolMessage, the model is not asked) and nothing runs; unpaused, the next
    resume runs the refund once and the model reads its result."""
    driver, shop, model, operators, records = setup()
    first = the_interrupt(await driver.run(QUESTION))
    await operators.decide(REFUND[0], approve=True)
    await maybe_await(records.pause_run(THREAD, by="ops@example", reason="incident"))
    held = the_interrupt(await driver.run(Command(resume=True)))
    assert held.value == first.value
    assert (await driver.state()).next == ("tools",)
    assert REFUND[0] not in shop.runs and len(model.requests) == 1
    record = await record_of(records, REFUND[0])
    assert record.state.stage is Stage.APPROVED
    await maybe_await(records.unpause_run(THREAD, by="ops@example", reason="resolved"))
    state = await driver.run(Command(resume=True))
    assert "__interrupt__" not in state
    assert shown(tool_messages(state)[REFUND[0]]) == REFUNDED
    assert shop.runs[REFUND[0]] == 1
    record = await record_of(records, REFUND[0])
    assert record.state.status is Status.READY
