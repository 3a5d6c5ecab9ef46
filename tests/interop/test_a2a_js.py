"""The npm ``@a2a-js/sdk`` client (someone else's client) against a real ``loom serve``: the
card, a message, a continued context, a streamed task, GetTask and CancelTask, and a task
parked for approval answered with free text (``tests/interop/a2a_js/flow.mjs``;
``scripts/test`` installs the package with ``npm ci``)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.server.conftest import Server, start_server, stop_server

JS = Path(__file__).parent / "a2a_js"
AGENTS = (Path(__file__).parent / "a2a_agents.py").read_text()
KEY = "js-client-key-01"

# the JS SDK's TaskState numbers (the protocol's enum)
WORKING, COMPLETED, CANCELED, INPUT_REQUIRED = 2, 3, 5, 6

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not (JS / "node_modules" / "@a2a-js" / "sdk").is_dir(),
    reason="needs Node.js and `npm ci --prefix tests/interop/a2a_js` (scripts/test runs it)",
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    pytest.importorskip("a2a.server")
    tmp = tmp_path_factory.mktemp("a2a_js")
    srv = start_server(tmp, app="a2a_agents:registry", source=AGENTS, env={"LOOM_API_KEYS": KEY})
    yield srv, tmp
    stop_server(srv)


def test_the_a2a_js_client_runs_the_core_flow(served: tuple[Server, Path]) -> None:
    srv, tmp = served
    done = subprocess.run(
        ["node", str(JS / "flow.mjs"), srv.url, KEY],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=JS,
    )
    assert done.returncode == 0, done.stderr + (tmp / "server.log").read_text()[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["card"] == {"name": "calc", "skills": ["calc", "calc.add"], "streaming": True}
    assert out["first"]["state"] == COMPLETED and out["first"]["answer"] == "The sum is 5."
    assert out["second"] == {"contextId": out["first"]["contextId"], "answer": "echo: hello again"}
    kinds = [e["kind"] for e in out["stream"]]
    assert kinds[0] == "task" and kinds[-1] == "statusUpdate"
    states = [e["state"] for e in out["stream"] if e["kind"] == "statusUpdate"]
    assert states[0] == WORKING and states[-1] == COMPLETED
    assert "calling add" in [e["text"] for e in out["stream"]]
    assert [e["text"] for e in out["stream"] if e["kind"] == "artifactUpdate"] == ["The sum is 42."]
    assert out["got"] == {"id": out["first"]["id"], "state": COMPLETED, "answer": "The sum is 5."}
    assert out["cancel"]["after"] == CANCELED
    assert out["parked"] == {
        "before": INPUT_REQUIRED,
        "after": COMPLETED,
        "sameTask": True,
        "answer": "done: Error (denied): rejected by the user: not today",
    }
    (tmp / "never-js.txt").write_text("late")
