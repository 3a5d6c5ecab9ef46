"""Built-in tools, chosen by name: ``Agent(tools=["read_file", "grep", "bash"])``.

| name        | effect        | what it does                                           |
| ----------- | ------------- | ------------------------------------------------------ |
| read_file   | pure          | read a text file (line range, size cap, binary check)   |
| write_file  | idempotent    | create or replace a file atomically                     |
| edit_file   | at_most_once  | replace an exact, unique string; returns a diff         |
| list_dir    | pure          | list one directory                                      |
| glob        | pure          | find files by glob pattern (``**`` recursive)           |
| grep        | pure          | search file contents by regular expression             |
| bash        | at_most_once  | run a shell command in the workspace (idempotent when   |
|             |               | sandboxed: ``Agent(sandbox=True)``)                     |
| python      | idempotent    | run a Python cell in the sandbox (value, files, images) |
| web_fetch   | idempotent    | HTTP GET a URL and return its text                      |

File tools only reach the agent's workspace (``loom.policy.scope``). Each module is imported
only when an agent asks for one of its tools.
"""
