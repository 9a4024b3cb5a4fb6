"""Which start-up log reader follows which inference engine's log (pure).

The control side's half of the engine interface (host/inference/ is the host's): a server's
record and its profile name the engine; follow asks here for the reader of that engine's log.
One reader per engine, imported when asked for: loadlog.py reads SGLang's, vllmlog.py vLLM's.
"""

from __future__ import annotations

import importlib

# engine name (host/inference KNOWN) -> the module whose LoadLog reads its start-up log
_READERS = {"sglang": "provision.logs.loadlog", "vllm": "provision.logs.vllmlog"}


def reader_for(engine: str):
    """The module reading `engine`'s start-up log (LoadLog, hint). Every engine host/inference knows
    has one (a test holds the two lists together)."""
    return importlib.import_module(_READERS[engine])
