"""Runs llama-cpp-python's OpenAI-compatible server (``python -m llama_cpp.server``) for tests.

The only difference from running the module directly: llama.cpp's extra CPU buffer types are
switched off first, as :mod:`loom.models.local` does, because its AMX path crashes on Q4_1
models on some CPUs. Arguments are passed through unchanged.
"""

from __future__ import annotations

import runpy

from loom.models.local import disable_extra_buffers

if __name__ == "__main__":
    disable_extra_buffers()
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
