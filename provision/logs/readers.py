"""Which start-up log reader follows which inference engine's log (pure).

The engines' one registry is host/inference/: each engine names the module of its log reader
(`log_reader`); follow asks here for it by the engine a server's record and its profile name.
loadlog.py reads SGLang's, vllmlog.py vLLM's; a third engine names its own.
"""

from __future__ import annotations

import importlib

from provision.host import inference


def reader_for(engine: str):
    """The module reading `engine`'s start-up log (LoadLog, hint), as the engine names it."""
    return importlib.import_module(inference.get(engine).log_reader)
