"""The memory in the agent frameworks people already run.

- :mod:`.langchain`: a middleware for LangChain v1's ``create_agent`` (extra ``[langchain]``).
- :mod:`.pydantic_ai`: a capability for pydantic-ai's ``Agent`` (extra ``[pydantic-ai]``).
- :mod:`.openai_agents`: a ``Session`` for the OpenAI Agents SDK (extra ``[openai-agents]``).

Each maps its framework's messages and calls onto one runtime, :class:`AgentMemory`, which runs
the plugin in the reference host's own turn path; the framework modules are imported only when
used, so this package needs none of them.
"""

from ._runtime import SOURCE_ID, AgentMemory, MemoryTool, PromptItem

__all__ = ["SOURCE_ID", "AgentMemory", "MemoryTool", "PromptItem"]
