"""An agent over a small local HTTP API: starts the inventory API (FastAPI, loopback), builds
an ``OpenAPIBackend`` from its own /openapi.json and asks one question.

    python examples/backends/openapi_agent.py "Which items are in stock?"
"""

from __future__ import annotations

import asyncio
import sys

from inventory_api import serve_in_thread

from loom import Agent
from loom.backends import OpenAPIBackend


async def main(question: str) -> None:
    with serve_in_thread() as url:
        api = OpenAPIBackend(f"{url}/openapi.json", base_url=url, tags=["items"])  # GET only
        agent = Agent("inventory", "Answer from the inventory API.", backends=[api],
                      max_iterations=4)  # fmt: skip
        result = await agent.run(question)
        print(result.output)


if __name__ == "__main__":
    asyncio.run(main(" ".join(sys.argv[1:]) or "Which items are in stock?"))
