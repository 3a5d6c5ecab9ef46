"""A crew run's frames on the LangGraph-compatible API.

A crew thread is the crew's session: its ``values`` are the crew's transcript (the task, the
crew's answer), framed as for an agent from the crew's own events. Each member's events come
as frames of the member: ``messages`` chunks and messages whose metadata names the member
(``langgraph_node`` and ``loom_member_path`` = ``crew/research/writer``), ``updates`` keyed by
the member path, ``events`` with ``data.member_path``. A member's messages never enter the
crew thread's values (they are in the member's child session). A crew parked on a member's
approval ends with one ``__interrupt__`` listing every parked call with its ``member_path``.

Frame ids: the crew's own events keep ``"<sequence>.<slot>"`` (so a replay from the crew
session's journal gives them the same ids); a member frame is ``"<s>.<10 + k>"``, the k-th
member frame since the crew event of sequence ``s``: unique, and ordered for ``Last-Event-ID``.
A replayed crew run (one this process no longer holds) has the crew's frames only.
"""

from __future__ import annotations

from typing import Any

from loom.events import AgentEvent, CrewMemberFinish, LlmComplete, LlmDelta
from loom.server.lg_runs import Frame, FrameMaker, lc_message

__all__ = ["CrewFrameMaker"]

_NODE = {"ai": "agent", "tool": "tools", "human": "__start__"}


class CrewFrameMaker(FrameMaker):
    """``FrameMaker`` for a crew run whose root member path is ``root`` (the crew's name)."""

    def __init__(self, thread_id: str, run_id: str, assistant_id: str, root: str) -> None:
        super().__init__(thread_id, run_id, assistant_id)
        self.root = root
        self.last_seq = 0  # the sequence of the newest crew event
        self.k = 0  # member frames since it
        self.member_streamed: dict[str, bool] = {}  # member run -> its answer came as deltas

    def meta(self, ev: AgentEvent, node: str) -> dict[str, Any]:
        return {
            **super().meta(ev, node),
            "loom_member_path": ev.extra.get("member_path", self.root),
        }

    def frames(self, ev: AgentEvent, offset: int = 0) -> list[Frame]:
        path = ev.extra.get("member_path", self.root)
        if path == self.root:
            self.last_seq, self.k = ev.sequence, 0
            out = super().frames(ev, offset)
            if isinstance(ev, CrewMemberFinish):  # what a member handed back, keyed by its path
                update = {
                    ev.path: {
                        "stop_reason": ev.stop_reason,
                        "output": ev.output,
                        "error": ev.error,
                        "reused": ev.reused,
                    }
                }
                out.append(Frame("updates", "updates", update, f"{ev.sequence}.7"))
            return out
        return self._member(ev, path)

    def _member(self, ev: AgentEvent, path: str) -> list[Frame]:
        out: list[Frame] = []
        meta = self.meta(ev, path)
        meta.update(loom_session_id=ev.session_id, loom_member_run_id=ev.run_id)
        msg_id = f"{ev.session_id}:{ev.run_id}:{ev.sequence}"
        if isinstance(ev, LlmDelta) and ev.delta:
            self.member_streamed[ev.run_id] = True
            chunk = {
                "type": "AIMessageChunk",
                "content": ev.delta,
                "id": f"{ev.run_id}:ai",
                "tool_calls": [],
                "tool_call_chunks": [],
                "additional_kwargs": {},
                "response_metadata": {},
            }
            out.append(Frame("messages-tuple", "messages", [chunk, meta]))
        m = ev.message()
        if m is not None:
            msg = lc_message(m, msg_id)
            streamed = isinstance(ev, LlmComplete) and self.member_streamed.pop(ev.run_id, False)
            if not streamed or msg.get("tool_calls"):
                out.append(Frame("messages-tuple", "messages", [msg, meta]))
            out.append(Frame("messages", "messages/complete", [msg]))
            out.append(
                Frame(
                    "updates",
                    "updates",
                    {path: {"messages": [msg], "node": _NODE.get(msg["type"])}},
                )
            )
        out.append(Frame("events", "events", ev.to_dict()))
        for f in out:
            f.id = f"{self.last_seq}.{10 + self.k}"
            self.k += 1
        return out
