"""``loom run --attach FILE`` and ``/attach PATH`` in ``loom chat`` (issue 27): the files go
to the model with the message; a missing file, one too large or of an unknown type is a typed
error before anything runs."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.server.conftest import Server, start_server, stop_server
from tests.server.test_media_surfaces import MEDIA_AGENTS, PDF, PNG, PNG_SHA

SRC = str(Path(__file__).resolve().parents[2] / "src")  # this checkout, not an installed loom

# `looker` answers with what media its model request held (kind, type, the bytes' sha256)
LOOKER = (
    MEDIA_AGENTS
    + """

def looking(**settings):
    return Agent(name="looker", model=FunctionModel(looker), **settings)
"""
)


def loom(tmp: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, str(tmp)]), NO_COLOR="1")
    return subprocess.run(
        [sys.executable, "-m", "loom", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=tmp,
        env=dict(env, COLUMNS="200"),
        timeout=120,
    )


@pytest.fixture
def here(tmp_path: Path) -> Path:
    (tmp_path / "media_agents.py").write_text(LOOKER)
    (tmp_path / "dot.png").write_bytes(PNG)
    (tmp_path / "report.pdf").write_bytes(PDF)
    return tmp_path


LOCAL = ("--agent", "media_agents:looking", "--store", ":memory:")


def test_run_attaches_files(here: Path) -> None:
    done = loom(
        here, "run", "what are these?", "--attach", "dot.png", "--attach", "report.pdf", *LOCAL
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"text='what are these?' parts=image image/png {PNG_SHA}; "
        f"file application/pdf {hashlib.sha256(PDF).hexdigest()}"
    )
    assert f"attached dot.png (image/png, {len(PNG):,} bytes)" in done.stderr
    assert "attached report.pdf (application/pdf" in done.stderr


@pytest.mark.parametrize(
    ("name", "make", "says"),
    [
        ("missing.png", None, "cannot attach missing.png: it does not exist"),
        ("huge.pdf", "sparse", "over the 33,554,432-byte limit"),
        ("blob.qqq", "random", "its type is unknown"),
        ("fake.png", "text", "claims image/png, but its bytes are not that"),
    ],
)
def test_bad_attachments_exit_2_before_running(
    here: Path, name: str, make: str | None, says: str
) -> None:
    path = here / name
    if make == "sparse":  # 33 MiB that takes no disk
        with path.open("wb") as f:
            f.truncate(33 * 1024 * 1024)
    elif make == "random":
        path.write_bytes(b"\x01\x02\x03 no known signature")
    elif make == "text":
        path.write_bytes(b"just text, not a PNG")
    done = loom(here, "run", "look", "--attach", name, *LOCAL)
    assert done.returncode == 2, done.stderr
    assert says in " ".join(done.stderr.split()), done.stderr
    assert "text=" not in done.stdout  # the model never ran


def test_chat_attach_goes_with_the_next_message(here: Path) -> None:
    typed = "/attach dot.png\nlook\nagain\n/attach nope.png\n/attach\nlast\n"
    done = loom(here, "chat", *LOCAL, stdin=typed)
    assert done.returncode == 0, done.stderr
    answers = [line for line in done.stdout.splitlines() if "text=" in line]
    assert [a.split("text=", 1)[1] for a in answers] == [
        f"'look' parts=image image/png {PNG_SHA}",
        "'again' parts=",  # attached to one message only
        "'last' parts=",  # the missing file attached nothing
    ]
    err = " ".join(done.stderr.split())
    assert (
        f"attached dot.png (image/png, {len(PNG):,} bytes); it goes with your next message" in err
    )
    assert "cannot attach nope.png: it does not exist" in err
    assert "usage: /attach PATH" in err


@pytest.fixture(scope="module")
def media_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(
        tmp_path_factory.mktemp("cli_media"),
        app="media_agents:registry",
        source=MEDIA_AGENTS,
        store=":memory:",
    )
    yield srv
    stop_server(srv)


def test_run_on_a_server_attaches_files(media_server: Server, here: Path) -> None:
    done = loom(
        here, "run", "--server", media_server.url, "-a", "looker", "look", "--attach", "dot.png"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"text='look' parts=image image/png {PNG_SHA}"


def test_chat_on_a_server_attaches_files(media_server: Server, here: Path) -> None:
    typed = "/attach dot.png\nlook\nagain\n"
    done = loom(here, "chat", "--server", media_server.url, "-a", "looker", stdin=typed)
    assert done.returncode == 0, done.stderr
    answers = [line.split("text=", 1)[1] for line in done.stdout.splitlines() if "text=" in line]
    assert answers == [f"'look' parts=image image/png {PNG_SHA}", "'again' parts="]
    assert "attached dot.png (image/png" in done.stderr
