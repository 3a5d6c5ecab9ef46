"""Shell command analysis for permission rules, with ``bashlex``.

A command line is split into its simple commands (across ``&&``, ``||``, ``;``, pipes,
subshells, ``if``/``for`` bodies, command and process substitutions, function bodies and the
string of ``sh -c``), so a rule is matched against each one: ``git status && rm -rf x`` is two
commands, and an allow rule for ``git status*`` covers only the first.

Constructs that can hide what runs are reported as *risks*; a command with a risk needs
approval unless an allow rule names the construct explicitly (see ``loom.policy.permissions``):
command and process substitution, redirection of output to a file, wrappers that run another
command (``sudo``, ``env``, ``xargs``, ``sh -c``, ``eval``, ...), a command name that is not a
literal word, function definitions, and assignments to variables that change what a command
runs or loads (``LD_PRELOAD=``, ``PATH=``, ``GIT_SSH_COMMAND=``, see ``DANGEROUS_VARIABLES``).

The command a runner carries (``xargs rm``, ``find . -exec rm {} ;``, ``sudo rm``, ``env rm``,
``nohup``/``timeout``/``nice`` ..., ``sh -c '...'``, ``watch '...'``, ``su -c '...'``) is analysed
too and reported as an *implied* command: deny and ask rules reach it, and it needs no allow
rule of its own (the runner itself asks). ``xargs`` appends its input to the command, so
``xargs rm`` is matched as ``rm`` and as ``rm {}``.

Other assignments in front of a command (``GIT_DIR=.git git status``) are normalised away for
matching: ``argv`` is the command without them.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import shlex
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DANGEROUS_VARIABLES", "WRAPPERS", "ShellAnalysis", "SimpleCommand", "analyze"]

WRAPPERS: frozenset[str] = frozenset(
    {
        "sudo",
        "doas",
        "su",
        "env",
        "xargs",
        "sh",
        "bash",
        "zsh",
        "dash",
        "ksh",
        "fish",
        "csh",
        "tcsh",
        "eval",
        "exec",
        "source",
        ".",
        "command",
        "builtin",
        "nohup",
        "timeout",
        "nice",
        "ionice",
        "time",
        "stdbuf",
        "setsid",
        "chroot",
        "unshare",
        "nsenter",
        "watch",
        "parallel",
        "flock",
        "script",
        "busybox",
        "find",
        "awk",
        "perl",
        "ssh",
    }
)
"""Commands that run other commands. ``find`` counts only with ``-exec``/``-execdir``/``-ok``/
``-delete``, ``awk`` only with ``system(``; the rest always."""

DANGEROUS_VARIABLES: tuple[str, ...] = (
    "LD_*",
    "DYLD_*",
    "*PATH",
    "PATH*",
    "BASH_ENV",
    "ENV",
    "BASH_FUNC_*",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "IFS",
    "PROMPT_COMMAND",
    "GLIBC_TUNABLES",
    "GCONV_PATH",
    "MALLOC_*",
    "PYTHON*",
    "PERL*",
    "RUBY*",
    "NODE_*",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "*_OPTIONS",
    "*OPTS",
    "GIT_CONFIG*",
    "GIT_SSH*",
    "GIT_EXEC_PATH",
    "GIT_EXTERNAL_DIFF",
    "GIT_PROXY_COMMAND",
    "GIT_ASKPASS",
    "SSH_ASKPASS",
    "*EDITOR",
    "VISUAL",
    "*PAGER",
    "LESSOPEN",
    "LESSCLOSE",
    "*_COMMAND",
    "*_CMD",
    "*_HOOK",
)
"""Variables (``fnmatch`` patterns) whose assignment in front of a command can change what
runs or is loaded; such an assignment asks unless an allow rule spells it (``LD_PRELOAD=``)."""

_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh"})
_FILE_REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>", "<>", ">&"})
_SAFE_TARGETS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
_MAX_DEPTH = 3


@dataclass(slots=True)
class SimpleCommand:
    """One command of a command line.

    ``text`` is its words with quotes removed, joined by spaces (what rules match);
    ``source`` is the exact source text, redirections included; ``risks`` name the constructs
    that need approval; ``name`` is the command's base name (``/usr/bin/git`` → ``git``).
    """

    text: str
    source: str
    name: str = ""
    risks: list[str] = field(default_factory=list)
    argv: str = ""  # base name + arguments, without leading VAR=value assignments
    implied: bool = False  # what a wrapper would run: deny/ask rules apply, allow is not needed

    def forms(self) -> list[str]:
        """The texts rules are matched against: as written, and normalised (``argv``)."""
        return [self.text] if not self.argv or self.argv == self.text else [self.text, self.argv]


@dataclass(slots=True)
class ShellAnalysis:
    """A parsed command line; ``error`` is set (and ``commands`` empty) when it cannot parse."""

    command: str
    commands: list[SimpleCommand] = field(default_factory=list)
    error: str | None = None


class _NoParser(Exception):
    pass


@functools.lru_cache(maxsize=512)
def analyze(command: str) -> ShellAnalysis:
    """Split ``command`` into its simple commands and their risks (cached)."""
    result = ShellAnalysis(command)
    try:
        _parse_into(command, result.commands, depth=0)
    except _NoParser:
        return ShellAnalysis(command, [], BASHLEX_MISSING)
    except Exception as exc:  # bashlex raises several types, all meaning "cannot tell"
        return ShellAnalysis(command, [], f"{type(exc).__name__}: {exc}")
    if not result.commands and command.strip():
        result.error = "no command found"
    return result


BASHLEX_MISSING = (
    "the shell parser bashlex is not installed, so the command cannot be checked against "
    "the permission rules; install it with: pip install 'loom-agents[tools]'"
)


def _parse_into(command: str, out: list[SimpleCommand], depth: int) -> None:
    try:
        import bashlex
    except ImportError:
        raise _NoParser from None

    if depth > _MAX_DEPTH:
        raise ValueError("commands nested too deeply")
    for tree in bashlex.parse(command):
        _visit(tree, command, out, depth)


def _visit(node: Any, src: str, out: list[SimpleCommand], depth: int) -> None:
    kind = getattr(node, "kind", "")
    if kind == "command":
        _command(node, src, out, depth)
        return
    if kind == "function":
        name = next((p.word for p in node.parts if p.kind == "word"), "?")
        out.append(
            SimpleCommand(f"{name}()", _slice(src, node), name, [f"function definition {name!r}"])
        )
    if kind == "redirect":
        risk = _redirect_risk(node)
        if risk:
            out.append(SimpleCommand(src.strip(), src.strip(), "", [risk]))
    for attr in ("parts", "list"):
        for child in getattr(node, attr, None) or ():
            _visit(child, src, out, depth)
    for attr in ("command", "output"):
        child = getattr(node, attr, None)
        if child is not None and not isinstance(child, int):
            _visit(child, src, out, depth)
    for child in getattr(node, "redirects", None) or ():
        _visit(child, src, out, depth)


def _slice(src: str, node: Any) -> str:
    start, end = node.pos
    return src[start:end]


def _command(node: Any, src: str, out: list[SimpleCommand], depth: int) -> None:
    words: list[str] = []
    risks: list[str] = []
    inner: list[Any] = []
    name = ""
    name_at = -1
    dynamic = False
    for part in node.parts:
        if part.kind == "assignment" and name_at < 0:
            var = part.word.split("=", 1)[0]
            if _dangerous(var):
                risks.append(f"assignment to {var}, which can change what runs")
        if part.kind in ("word", "assignment"):
            if part.kind == "word" and name_at < 0 and not dynamic:
                if any(p.kind in ("parameter", "commandsubstitution") for p in part.parts or ()):
                    dynamic = True
                else:
                    name = os.path.basename(part.word) or part.word
                    name_at = len(words)
            words.append(part.word)
            for sub in part.parts or ():
                if sub.kind == "commandsubstitution":
                    risks.append("command substitution")
                    inner.append(sub.command)
                elif sub.kind == "processsubstitution":
                    risks.append("process substitution")
                    inner.append(sub.command)
        elif part.kind == "redirect":
            risk = _redirect_risk(part)
            if risk:
                risks.append(risk)
            output = getattr(part, "output", None)
            if output is not None and not isinstance(output, int):
                for sub in getattr(output, "parts", None) or ():
                    if sub.kind in ("commandsubstitution", "processsubstitution"):
                        risks.append(sub.kind.replace("substitution", " substitution"))
                        inner.append(sub.command)
    if dynamic:
        risks.append("the command name is not a literal word")
    args = words[name_at + 1 :] if name_at >= 0 else words
    wrapper = _wrapper_risk(name, args)
    if wrapper:
        risks.append(wrapper)
    argv = " ".join([name, *args]) if name else ""
    out.append(SimpleCommand(" ".join(words), _slice(src, node), name, _unique(risks), argv))
    # What a runner runs: analysed like any command line, so deny rules reach it (and what it
    # runs in turn), but marked implied: it needs no allow rule of its own.
    for carried in _carried(name, args):
        _parse_implied(shlex.join(carried), out, depth + 1)
    for sub in inner:
        _visit(sub, src, out, depth)
    if name in _SHELLS and "-c" in args:  # look inside: deny rules still apply there
        i = args.index("-c")
        if i + 1 < len(args):
            _parse_into(args[i + 1], out, depth + 1)
    elif name == "eval" and args:
        _parse_into(" ".join(args), out, depth + 1)
    elif name in _RUN_STRING and args:
        # ``watch``, ``su -c``, ``script -c``, ``flock -c`` hand a string to a shell.
        text = _string_argument(name, args)
        if text:
            _parse_implied(text, out, depth + 1)


def _parse_implied(command: str, out: list[SimpleCommand], depth: int) -> None:
    first = len(out)
    _parse_into(command, out, depth)
    for c in out[first:]:
        c.implied = True


_RUN_STRING = frozenset({"watch", "su", "script", "flock"})


def _string_argument(name: str, args: list[str]) -> str:
    if name == "watch":
        return " ".join(a for a in args if not a.startswith("-"))
    for flag in ("-c", "--command"):
        if flag in args:
            i = args.index(flag)
            if i + 1 < len(args):
                return args[i + 1]
    return ""


@functools.lru_cache(maxsize=256)
def _dangerous(var: str) -> bool:
    return any(fnmatch.fnmatchcase(var, p) for p in DANGEROUS_VARIABLES)


_UNWRAP = frozenset(
    {
        "sudo",
        "doas",
        "env",
        "nohup",
        "command",
        "builtin",
        "exec",
        "nice",
        "ionice",
        "time",
        "stdbuf",
        "setsid",
        "timeout",
        "xargs",
        "flock",
        "chroot",
        "unshare",
        "nsenter",
        "busybox",
        "parallel",
        "ssh",
        "caffeinate",
        "systemd-run",
        "firejail",
        "proxychains",
        "torsocks",
    }
)
_FIND_EXEC = frozenset({"-exec", "-execdir", "-ok", "-okdir"})


def _carried(name: str, args: list[str]) -> list[list[str]]:
    """The command lines a runner may run.

    For ``find``, each ``-exec ... ;`` body. For the others (``sudo -u x rm y``), each tail of
    the arguments that starts at a plain word (``x rm y``, ``rm y``, ``y``), at most five, since
    which words are option values cannot be known; ``xargs`` tails also with ``{}`` appended,
    standing for the input it adds.
    """
    if name == "find":
        found: list[list[str]] = []
        for i, a in enumerate(args):
            if a in _FIND_EXEC:
                body: list[str] = []
                for w in args[i + 1 :]:
                    if w in (";", "\\;", "+"):
                        break
                    body.append(w)
                if body:
                    found.append(body)
        return found
    if name not in _UNWRAP:
        return []
    starts = [
        i for i, a in enumerate(args) if not a.startswith("-") and not (name == "env" and "=" in a)
    ]
    tails = [args[i:] for i in starts[:5]]
    if name == "xargs":
        tails += [[*t, "{}"] for t in tails]
    return tails


def _redirect_risk(node: Any) -> str | None:
    if node.type not in _FILE_REDIRECTS:
        return None
    output = getattr(node, "output", None)
    if output is None or isinstance(output, int):
        return None
    target = getattr(output, "word", "")
    if target in _SAFE_TARGETS or target.isdigit() or target == "-":
        return None
    return f"output redirected to a file ({target})"


def _wrapper_risk(name: str, args: list[str]) -> str | None:
    if name not in WRAPPERS:
        return None
    if name == "find":
        return (
            "find runs commands (-exec/-delete)"
            if any(a in ("-exec", "-execdir", "-ok", "-okdir", "-delete") for a in args)
            else None
        )
    if name == "awk":
        return "awk runs commands (system)" if any("system(" in a for a in args) else None
    return f"'{name}' runs another command"


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
