"""Adapters that route the tool calls of agent stacks through a ``ToolBoundary``.

One module per stack (``canon.integrations.openai``, ``.anthropic``, ``.gemini``,
``.openai_agents``, ``.langgraph``, ``.mcp``, ``.pydantic_ai``, ``.smolagents``,
``.llamaindex``), each an optional extra
(``pip install 'canon-store[openai]'`` ...) that imports only its own SDK, and only when
the module is imported. An adapter speaks its stack's own types, ids and error
conventions and holds no logic the boundary already has: preflight, budgets, duplicates,
replay and the records all stay in the boundary.
"""
