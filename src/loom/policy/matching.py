"""Pattern matching for permission rules: path globs (``docs/**``) and command prefixes."""

from __future__ import annotations

import functools
import re

__all__ = ["compile_path_glob", "compile_text_pattern", "path_matches", "text_matches"]


@functools.lru_cache(maxsize=1024)
def compile_path_glob(pattern: str) -> re.Pattern[str]:
    """A glob over ``/``-separated paths: ``*`` and ``?`` stay in one segment, ``**`` spans any.

    ``docs/**`` matches everything below ``docs``; ``**/*.py`` matches Python files at any
    depth (including the top level); ``[abc]`` / ``[!abc]`` are character classes.
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                if pattern.startswith("**/", i):
                    out.append("(?:.*/)?")
                    i += 3
                else:
                    out.append(".*")
                    i += 2
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 2)
            if end == -1:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end]
                neg = body.startswith("!")
                body = re.escape(body[1:] if neg else body).replace(r"\-", "-")
                out.append(f"[{'^' if neg else ''}{body}]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("(?s:" + "".join(out) + r")\Z")


@functools.lru_cache(maxsize=1024)
def compile_text_pattern(pattern: str) -> re.Pattern[str]:
    """A command or URL pattern: ``*`` matches any text (spaces and ``/`` too); all else literal."""
    return re.compile("(?s:" + ".*".join(re.escape(p) for p in pattern.split("*")) + r")\Z")


def path_matches(pattern: str, path: str) -> bool:
    return compile_path_glob(pattern).match(path) is not None


def text_matches(pattern: str, text: str) -> bool:
    return compile_text_pattern(pattern).match(text) is not None
