"""The engine: everything that runs a run, in one folder.

- ``runtime``: ``Runtime`` (what a process holds: store, leases, caches, connections) and its one
  front door, ``Runtime.start(target, input, session_id=..., options=...)``, with the
  ``Runnable`` protocol an ``Agent`` and a ``Crew`` implement;
- ``run_inputs``: what a run is started for (``NewMessage``, ``Resume``, ``Answer``,
  ``CarryOn``) and its per-run ``RunOptions``;
- ``loop``: ``Turn``, the state machine of one agent run (INTAKE → CONTEXT → EXECUTE →
  PERSIST); ``calls``: its tool half; ``journal``: the only writer (number, commit, then emit);
- ``gates``: the session envelope (lock, lease, keep-alive, release) every run holds, a crew's
  too; ``recovery``: what a dead run left open and how a new run closes it;
- ``driving``: streaming a run's events; ``run_deps``: what one turn runs with (``RunDeps``)
  and what it needs of its runtime (``TurnHost``); ``turn_spec``: the agent as the engine reads
  it (``TurnSpec``).

The seams (context builders, hooks, plugins, definitions) sit beside it and read an
``AgentSpec`` (``loom.spec``), never the engine; docs/architecture.md draws the floors.
"""
