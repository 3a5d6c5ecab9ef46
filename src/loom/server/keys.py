"""API keys for ``loom serve``: the key ring (keys held only as SHA-256 digests, a plain key
is hashed when it is loaded) and the YAML key file. Who a key is, and what it may see, is
``loom.server.ownership.Principal``; the middleware that asks for a key is
``loom.server.security``."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from loom.errors import ConfigurationError
from loom.server.ownership import Principal

__all__ = ["ENV_KEYS", "KeyRing", "key_digest", "load_keys"]

ENV_KEYS = "LOOM_API_KEYS"


def key_digest(key: str) -> bytes:
    """The SHA-256 digest a key is held as."""
    return hashlib.sha256(key.encode()).digest()


class KeyRing:
    """The configured keys; ``match`` finds the key a client presented (constant-time per key)."""

    def __init__(self, principals: Iterable[Principal] = ()) -> None:
        self.principals = list(principals)
        names = [p.name for p in self.principals]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ConfigurationError(f"API key names must be unique; repeated: {sorted(dupes)}")

    def __bool__(self) -> bool:
        return bool(self.principals)

    def __len__(self) -> int:
        return len(self.principals)

    def match(self, presented: str) -> Principal | None:
        digest, found = key_digest(presented), None
        for p in self.principals:  # no early exit: the time does not depend on which key matched
            if hmac.compare_digest(digest, p.digest) and found is None:
                found = p
        return found


# a key's name starts the ids of its sessions (``<name>~<id>``): no path or URL syntax in it
_KEY_NAME = re.compile(r"[A-Za-z0-9._@:+-]{1,64}")


def load_keys(path: str | Path | None = None, env: str | None = None) -> KeyRing:
    """Keys from a YAML file (a list of ``{name, key | key_sha256, agents?, admin?}``, or
    ``{keys: [...]}``) and from ``env`` (the ``LOOM_API_KEYS`` value: plain keys, comma-separated,
    named ``env-1``, ``env-2``, ...)."""
    import yaml

    principals: list[Principal] = []
    if path is not None:
        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text())
        except OSError as exc:
            raise ConfigurationError(f"cannot read the key file {p}: {exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigurationError(f"the key file {p} is not valid YAML: {exc}") from None
        if isinstance(data, dict) and "keys" in data:
            data = data["keys"]
        if not isinstance(data, list) or not data:
            raise ConfigurationError(
                f"the key file {p} must hold a list of {{name, key or key_sha256, agents}} entries"
            )
        for i, entry in enumerate(data):
            principals.append(_entry(entry, f"{p} entry {i + 1}"))
    for i, key in enumerate(k.strip() for k in (env or "").split(",") if k.strip()):
        principals.append(Principal(f"env-{i + 1}", key_digest(key)))
    return KeyRing(principals)


def _entry(entry: Any, where: str) -> Principal:
    if not isinstance(entry, dict):
        raise ConfigurationError(f"{where}: expected a mapping with name and key, got {entry!r}")
    unknown = set(entry) - {"name", "key", "key_sha256", "agents", "admin"}
    if unknown:
        raise ConfigurationError(f"{where}: unknown fields {sorted(unknown)}")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"{where}: every key needs a name")
    if not _KEY_NAME.fullmatch(name):
        raise ConfigurationError(
            f"{where} ({name!r}): a key name is letters, digits and . _ - @ : + "
            "(it starts the key's session ids, docs/server.md)"
        )
    key, hashed = entry.get("key"), entry.get("key_sha256")
    if (key is None) == (hashed is None):
        raise ConfigurationError(f"{where} ({name}): give exactly one of key or key_sha256")
    if key is not None:
        if not isinstance(key, str) or len(key) < 8:
            raise ConfigurationError(f"{where} ({name}): a key is a string of 8 characters or more")
        digest = key_digest(key)
    else:
        if not isinstance(hashed, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", hashed):
            raise ConfigurationError(f"{where} ({name}): key_sha256 is 64 hex digits")
        digest = bytes.fromhex(hashed)
    agents = entry.get("agents")
    if agents is not None and (
        not isinstance(agents, list) or not all(isinstance(a, str) for a in agents)
    ):
        raise ConfigurationError(f"{where} ({name}): agents is a list of agent names")
    return Principal(
        name, digest, frozenset(agents) if agents is not None else None, bool(entry.get("admin"))
    )
