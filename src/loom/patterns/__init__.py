"""Domain patterns: YAML files matched to each user message by TF-IDF, placed in ROM for the turn.

```python
from loom.patterns import PatternLibrary

library = PatternLibrary.from_dir("patterns/", watch=True)   # reloads when files change
for pattern, score in library.match("my query got slow since the last deploy", k=3):
    print(pattern.name, score)
agent = Agent(..., patterns=library)                         # matched patterns go into ROM
library.close()
```
scikit-learn and watchfiles are imported only when a library is built or watched.
"""

from __future__ import annotations

from loom.patterns.index import DEFAULT_K, DEFAULT_MIN_SCORE, PatternIndex, build_index
from loom.patterns.library import PatternLibrary
from loom.patterns.model import LoadResult, Pattern, PatternProblem, load_dir, load_file

__all__ = [
    "DEFAULT_K",
    "DEFAULT_MIN_SCORE",
    "LoadResult",
    "Pattern",
    "PatternIndex",
    "PatternLibrary",
    "PatternProblem",
    "build_index",
    "load_dir",
    "load_file",
]
