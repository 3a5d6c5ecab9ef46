"""``PermissionManager`` (seed 002): allow, deny or ask, per tool and per argument pattern.

Rules are written ``tool`` or ``tool(pattern)``:

```python
PermissionManager({
    "allow": ["read_file", "grep", "bash(git status*)", "write_file(docs/**)"],
    "deny": ["bash(rm *)", "web_fetch"],
    "ask": ["bash(git push*)"],
    "default": "ask",          # for calls no rule matches
    "safe_mode": False,        # True: every call that is not denied asks
})
PermissionManager({"bash": "deny", "read_file": "allow"}, default="ask")   # seed 002 form
```

What a pattern is matched against depends on the tool: file tools match the workspace-relative
path (``docs/**`` glob syntax, checked both as written and with links resolved); ``bash``
matches every simple command of the parsed command line (``loom.policy.shell``), so all of them
must be allowed; ``web_fetch`` matches the URL; other tools match their arguments as compact
JSON. ``*`` in a non-path pattern matches any text.

Precedence: deny > ask > allow > default, and safe mode turns every allow into ask. A call the
manager does not allow is returned as ``Deny`` or ``RequireApproval`` from the
``before_tool_execution`` hook; the agent installs the manager as its first hook. Decisions a
human asked to remember are kept per session (and read back from the event journal after a
restart) and rank between deny and ask.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from loom.errors import ConfigurationError, PermissionsFileError
from loom.hooks import Deny, HookContext, RequireApproval
from loom.messages import ToolCall
from loom.policy.matching import path_matches, text_matches
from loom.policy.shell import BASHLEX_MISSING, analyze

if TYPE_CHECKING:
    from loom.tools.base import Tool

__all__ = [
    "DEFAULT_RULES",
    "Action",
    "PermissionManager",
    "PermissionRule",
    "PermissionVerdict",
    "build_permissions",
    "subject_of",
    "subjects_of",
]

Action = Literal["allow", "deny", "ask"]
_ACTIONS: tuple[Action, ...] = ("deny", "ask", "allow")
_STRICTNESS = {"allow": 0, "ask": 1, "deny": 2}
_RULE_RE = re.compile(r"^([A-Za-z0-9_*.-]+)(?:\((.*)\))?$", re.S)

DEFAULT_RULES: dict[str, Action] = {
    "bash": "ask",
    "python": "ask",  # writes the workspace, like write_file (sandboxed or not)
    "write_file": "ask",
    "edit_file": "ask",
    "web_fetch": "ask",
}
"""What an agent without ``permissions=`` gets: built-ins that change things or reach the
network ask, everything else (your own tools, read-only built-ins) is allowed."""

PROJECT_FILE = ".loom/permissions.yaml"

log = logging.getLogger("loom.policy")

# Built-in subjects, for tools that do not carry a ``permission_subject`` attribute.
_SUBJECTS: dict[str, tuple[str, str]] = {
    "read_file": ("path", "path"),
    "write_file": ("path", "path"),
    "edit_file": ("path", "path"),
    "list_dir": ("path", "path"),
    "glob": ("path", "path"),
    "grep": ("path", "path"),
    "bash": ("command", "command"),
    "web_fetch": ("url", "url"),
}


@dataclass(frozen=True, slots=True)
class PermissionRule:
    """``tool(pattern) -> action``; ``pattern`` None matches any arguments."""

    tool: str
    pattern: str | None
    action: Action
    source: str = "agent"

    @classmethod
    def parse(cls, spec: str, action: str, source: str = "agent") -> PermissionRule:
        if action not in _ACTIONS:
            raise ConfigurationError(
                f"permission rule {spec!r} ({source}): action must be allow, deny or ask, "
                f"got {action!r}"
            )
        m = _RULE_RE.match(spec.strip()) if isinstance(spec, str) else None
        if m is None:
            raise ConfigurationError(
                f"permission rule {spec!r} ({source}) is not 'tool' or 'tool(pattern)', "
                "e.g. 'bash(git status*)' or 'write_file(docs/**)'"
            )
        return cls(m.group(1), m.group(2), action, source)

    def __str__(self) -> str:
        return self.tool if self.pattern is None else f"{self.tool}({self.pattern})"


@dataclass(frozen=True, slots=True)
class PermissionVerdict:
    """The outcome of a check: the action, why, and the rule that decided (if one did)."""

    action: Action
    reason: str
    rule: PermissionRule | None = None


class PermissionManager:
    """Decides, for each tool call, whether it runs, is refused, or waits for a human.

    Args:
        rules: ``{"allow": [...], "deny": [...], "ask": [...]}``, ``{"tool(pattern)": action}``,
            or a list of ``PermissionRule``; may also hold ``default`` and ``safe_mode``.
        default: Action for calls no rule matches (``"ask"``).
        safe_mode: Every call that is not denied needs approval.
    """

    fatal = True  # a broken policy must stop the run, not let calls through

    def __init__(
        self,
        rules: Mapping[str, Any] | Sequence[PermissionRule] | None = None,
        *,
        default: Action = "ask",
        safe_mode: bool = False,
        source: str = "agent",
    ) -> None:
        self.rules: list[PermissionRule] = []
        self.default: Action = default
        self.safe_mode = safe_mode
        if isinstance(rules, Mapping):
            self._load(rules, source)
        elif rules is not None:
            for r in rules:
                if not isinstance(r, PermissionRule):
                    raise ConfigurationError(f"permissions: expected PermissionRule, got {r!r}")
                self.rules.append(r)
        if self.default not in _ACTIONS:
            raise ConfigurationError(
                f"permissions: default must be allow, deny or ask, got {self.default!r}"
            )
        # rules that name each tool, valid while ``rules`` equals the snapshot (see _relevant)
        self._relevant_memo: tuple[list[PermissionRule], dict[str, list[PermissionRule]]] | None
        self._relevant_memo = None  # made on the first check: agents cost little to construct

    def _load(self, config: Mapping[str, Any], source: str) -> None:
        for key, value in config.items():
            if key == "default":
                self.default = value
            elif key == "safe_mode":
                if not isinstance(value, bool):
                    raise ConfigurationError(
                        f"permissions ({source}): safe_mode must be true or false, got {value!r}"
                    )
                self.safe_mode = value
            elif key in _ACTIONS:
                specs = [value] if isinstance(value, str) else value
                if not isinstance(specs, Iterable):
                    raise ConfigurationError(
                        f"permissions ({source}): {key!r} must be a list of rules"
                    )
                self.rules.extend(PermissionRule.parse(s, key, source) for s in specs)
            else:
                self.rules.append(PermissionRule.parse(key, value, source))

    @classmethod
    def load(cls, path: str | Path) -> PermissionManager:
        """Rules from a YAML file (same shapes as the constructor's ``rules``)."""
        import yaml

        p = Path(path)
        example = "e.g. 'allow: [read_file]' and 'deny: [\"bash(rm *)\"]'"
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except UnicodeDecodeError as exc:
            raise PermissionsFileError(
                f"cannot read permission rules: the file is not UTF-8 text (byte "
                f"{exc.object[exc.start]:#04x} at offset {exc.start}). Write it as UTF-8 YAML, "
                f"{example}, or delete it",
                path=str(p),
            ) from None
        except OSError as exc:
            raise PermissionsFileError(
                f"cannot read permission rules: {exc.strerror or exc}", path=str(p)
            ) from None
        except yaml.YAMLError as exc:
            raise PermissionsFileError(
                f"cannot read permission rules: the YAML does not parse: {exc}", path=str(p)
            ) from None
        if not isinstance(data, Mapping):
            raise PermissionsFileError(
                f"permission rules must be a YAML mapping, {example}", path=str(p)
            )
        return cls(data, source=str(p))

    def merged(self, other: PermissionManager) -> PermissionManager:
        """Both rule sets; the stricter default and safe mode win."""
        merged = PermissionManager(
            [*self.rules, *other.rules],
            default=max(self.default, other.default, key=_STRICTNESS.__getitem__),
            safe_mode=self.safe_mode or other.safe_mode,
        )
        return merged

    def __repr__(self) -> str:
        rules = ", ".join(f"{r}: {r.action}" for r in self.rules)
        return f"PermissionManager({{{rules}}}, default={self.default!r}, safe={self.safe_mode})"

    # -- checking -----------------------------------------------------------------------------
    def check(
        self,
        call: ToolCall,
        tool: Tool | None = None,
        *,
        workspace: Path | None = None,
        remembered: Sequence[PermissionRule] = (),
    ) -> PermissionVerdict:
        """The verdict for one call (pure: no I/O except resolving paths in the workspace).

        ``remembered`` are the session's "always"/"never" decisions (read from its journal by
        the runtime, never kept here: one manager serves every session and process)."""
        name = call.name
        relevant = self._relevant(name)
        remembered = [r for r in remembered if r.tool == name or text_matches(r.tool, name)]
        key, kind = subject_of(tool, name)
        groups: list[_Forms]
        if kind == "command":
            groups = _command_forms(call, key)
        elif any(r.pattern is not None for r in (*relevant, *remembered)):
            groups = [_Forms([s]) for s in subjects_of(call, key, kind, workspace)]
        else:  # no rule looks at the arguments: skip parsing and resolving them
            groups = [_Forms([None])]
        verdicts = []
        for g in groups:
            v = self._decide_forms(name, g.forms, kind, relevant, remembered)
            # What a runner carries must not be denied, but need not be allowed on its own.
            if not g.implied or (v.action != "allow" and v.rule is not None):
                verdicts.append(v)
        deny = next((v for v in verdicts if v.action == "deny"), None)
        if deny is not None:
            return deny
        if kind == "command":
            risky = _unlisted_risk(call, relevant + remembered)
            if risky is not None:
                verdicts.append(risky)
        ask = next((v for v in verdicts if v.action == "ask"), None)
        if ask is not None:
            return ask
        if self.safe_mode:
            return PermissionVerdict("ask", f"safe mode: every call to {name} needs approval")
        return verdicts[0] if verdicts else PermissionVerdict("allow", "no subject")

    def _relevant(self, name: str) -> list[PermissionRule]:
        """The rules whose tool pattern matches ``name`` (memoised: checks run every call)."""
        memo = self._relevant_memo
        # ``rules`` is a public list: any edit drops the memo (as do many distinct names)
        if memo is None or memo[0] != self.rules or len(memo[1]) > 256:
            memo = self._relevant_memo = (list(self.rules), {})
        rules, by_name = memo
        hit = by_name.get(name)
        if hit is None:
            hit = by_name[name] = [r for r in rules if r.tool == name or text_matches(r.tool, name)]
        return hit

    def _decide_forms(
        self,
        name: str,
        forms: list[str | None],
        kind: str,
        rules: list[PermissionRule],
        remembered: list[PermissionRule],
    ) -> PermissionVerdict:
        """One subject written several ways (``FOO=1 git status`` and ``git status``): denied or
        asked if any form is, allowed if any form is allowed, else the default."""
        if len(forms) == 1:
            return self._decide(name, forms[0], kind, rules, remembered)
        found = [self._decide(name, f, kind, rules, remembered) for f in forms]
        for wanted in ("deny", "ask", "allow"):
            for v in found:
                if v.action == wanted and v.rule is not None:
                    return v
        return found[0]

    def _decide(
        self,
        name: str,
        subject: str | None,
        kind: str,
        rules: list[PermissionRule],
        remembered: list[PermissionRule],
    ) -> PermissionVerdict:
        def hits(pool: list[PermissionRule], action: str) -> PermissionRule | None:
            for r in pool:
                if r.action == action and _pattern_hits(r.pattern, subject, kind):
                    return r
            return None

        shown = name if subject is None else f"{name}({subject})"
        if (r := hits(rules, "deny") or hits(remembered, "deny")) is not None:
            return PermissionVerdict("deny", f"{shown} is denied by the rule {r} ({r.source})", r)
        if (r := hits(remembered, "allow")) is not None:
            return PermissionVerdict("allow", f"approved earlier in this session ({r})", r)
        if (r := hits(rules, "ask")) is not None:
            return PermissionVerdict("ask", f"{shown} needs approval (rule {r}, {r.source})", r)
        if (r := hits(rules, "allow")) is not None:
            return PermissionVerdict("allow", f"allowed by {r}", r)
        return PermissionVerdict(
            self.default, f"{shown}: no rule matches; the default is {self.default}"
        )

    # -- the hook -----------------------------------------------------------------------------
    async def before_tool_execution(
        self, ctx: HookContext, call: ToolCall
    ) -> Deny | RequireApproval | None:
        tool = ctx.tools.get(call.name)
        if self._plainly_allowed(call.name, tool, ctx.remembered):
            return None
        verdict = self.check(call, tool, workspace=ctx.agent.workspace, remembered=ctx.remembered)
        if verdict.action == "deny":
            return Deny(verdict.reason)
        if verdict.action == "ask":
            return RequireApproval(verdict.reason)
        return None

    def _plainly_allowed(
        self, name: str, tool: Tool | None, remembered: Sequence[PermissionRule]
    ) -> bool:
        """True when ``check`` could only answer the default "allow": no rule names the tool,
        nothing was remembered in the session, and it is not a command (which is screened for
        risky words). Most calls of most agents take this path, so it skips building a verdict.
        """
        return (
            self.default == "allow"
            and not self.safe_mode
            and not self._relevant(name)
            and not remembered
            and subject_of(tool, name)[1] != "command"
        )


@dataclass(slots=True)
class _Forms:
    """The ways one subject is written; ``implied``: only deny and ask rules apply to it (the
    command a runner such as ``xargs`` or ``sudo`` carries)."""

    forms: list[str | None]
    implied: bool = False


def _command_forms(call: ToolCall, key: str | None) -> list[_Forms]:
    value = call.arguments.get(key or "command")
    command = "" if value is None else str(value)
    found = analyze(command)
    if found.error is not None or not found.commands:
        return [_Forms([command])]  # unparseable: matched whole, and _unlisted_risk asks
    return [_Forms(list(c.forms()), c.implied) for c in found.commands]


def subject_of(tool: Tool | None, name: str) -> tuple[str | None, str]:
    """Which argument of a call to ``name`` the rules match (None: the whole arguments, as
    JSON) and its kind (``"path"``, ``"command"``, ``"url"``, ``"text"``)."""
    subject = getattr(tool, "permission_subject", None) or _SUBJECTS.get(name)
    if subject is None:
        return None, "text"
    return subject[0], subject[1]


def subjects_of(call: ToolCall, key: str | None, kind: str, workspace: Path | None) -> list[Any]:
    """The values of ``call`` that rules are matched against (``subject_of``'s ``key`` and
    ``kind``): a path as written and with links resolved, else the one value."""
    args = call.arguments
    if key is None:
        return [json.dumps(args, sort_keys=True, separators=(",", ":"), default=str)]
    value = args.get(key)
    if value is None:
        value = "." if kind == "path" else ""
    value = str(value)
    if kind == "path":
        return _path_variants(value, workspace)
    return [value]


def _path_variants(path: str, workspace: Path | None) -> list[str]:
    """The path as written (normalised) and with links resolved, both workspace-relative."""
    root = str(workspace) if workspace is not None else None
    if root is not None and path.startswith("/"):
        real_root = os.path.realpath(root)
        for r in (real_root, os.path.abspath(root)):
            if path == r or path.startswith(r.rstrip("/") + "/"):
                path = path[len(r.rstrip("/")) + 1 :] or "."
                break
    lexical = posixpath.normpath(path) if path else "."
    variants = [lexical]
    if root is not None and not lexical.startswith(("/", "../")) and lexical != "..":
        real_root = os.path.realpath(root)
        resolved = os.path.realpath(os.path.join(real_root, lexical))
        if resolved == real_root:
            variants.append(".")
        elif resolved.startswith(real_root + "/"):
            variants.append(resolved[len(real_root) + 1 :])
        else:
            variants.append(resolved)  # outside: only "any" rules match it; scope refuses it
    return list(dict.fromkeys(variants))


def _pattern_hits(pattern: str | None, subject: str | None, kind: str) -> bool:
    if pattern is None:
        return True
    if subject is None:
        return False
    if kind == "path":
        return path_matches(pattern, subject)
    return text_matches(pattern, subject)


def _unlisted_risk(call: ToolCall, rules: list[PermissionRule]) -> PermissionVerdict | None:
    """Ask for a shell construct no allow rule names explicitly (see ``loom.policy.shell``)."""
    command = str(call.arguments.get("command", ""))
    found = analyze(command)
    if found.error == BASHLEX_MISSING:
        _warn_no_parser()
        why = f"bash: {BASHLEX_MISSING}. Until then every command needs approval"
        return PermissionVerdict("ask", why)
    if found.error is not None:
        return PermissionVerdict(
            "ask", f"bash: the command could not be parsed ({found.error}); it needs approval"
        )
    allows = [r for r in rules if r.action == "allow" and r.pattern]
    for c in found.commands:
        for risk in c.risks:
            if not any(
                _names(r.pattern or "", risk, c) and text_matches(r.pattern or "", c.source)
                for r in allows
            ):
                return PermissionVerdict("ask", f"bash: {risk} in {c.source!r} needs approval")
    return None


@functools.cache
def _warn_no_parser() -> None:
    log.warning("%s", BASHLEX_MISSING)


def _names(pattern: str, risk: str, c: Any) -> bool:
    """Whether an allow pattern explicitly names the risky construct."""
    if risk.startswith("assignment to "):
        return risk.split()[2].rstrip(",") + "=" in pattern
    if risk.startswith("output redirected"):
        return ">" in pattern
    if risk.endswith("substitution"):
        return "$(" in pattern or "`" in pattern or "<(" in pattern or ">(" in pattern
    if risk.startswith("find runs"):
        return any(flag in pattern for flag in ("-exec", "-ok", "-delete"))
    if risk.startswith("awk runs"):
        return "system(" in pattern
    first = pattern.split(" ", 1)[0]
    return bool(c.name) and os.path.basename(first) == c.name


_default_memo: tuple[tuple[tuple[str, Any], ...], PermissionManager] | None = None


def _default_manager() -> PermissionManager:
    """A new manager of ``DEFAULT_RULES``: parsed once (again if the dict changes), then
    copied per agent (each agent's manager and rule list stay its own to change)."""
    global _default_memo
    key = tuple(DEFAULT_RULES.items())
    memo = _default_memo
    if memo is None or memo[0] != key:
        template = PermissionManager(dict(DEFAULT_RULES), default="allow", source="default")
        memo = _default_memo = (key, template)
    template = memo[1]
    manager = PermissionManager(template.rules, default=template.default)
    manager.safe_mode = template.safe_mode
    return manager


def build_permissions(
    permissions: PermissionManager | Mapping[str, Any] | None, workspace: Path | None
) -> PermissionManager:
    """The agent's manager: its own rules (or ``DEFAULT_RULES``) plus the project file's.

    ``workspace/.loom/permissions.yaml``, when present, adds its rules; its default and safe
    mode apply when they are stricter.
    """
    if isinstance(permissions, PermissionManager):
        manager = permissions
    elif permissions is None:
        manager = _default_manager()
    elif isinstance(permissions, Mapping):
        manager = PermissionManager(permissions)
    else:
        raise ConfigurationError(
            "permissions must be a mapping of rules or a PermissionManager, got "
            f"{type(permissions).__name__}"
        )
    if workspace is not None:
        project = Path(workspace) / PROJECT_FILE
        if project.is_file():
            manager = manager.merged(PermissionManager.load(project))
    return manager
