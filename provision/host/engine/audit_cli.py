"""``python3 -m provision.host.engine.audit_cli [MODELS_DIR [PACKAGE_ROOT]]``: the audit of an
installed SGLang's ``models/`` directory as JSON, for a maintainer on a host or a checkout
(provision itself runs the audit through the ``audit`` op, host/ops/audit.py). Without
MODELS_DIR, the models of the sglang this python finds (without importing it)."""

from __future__ import annotations

import json
import os
import sys

from provision.host.engine.audit import audit_models


def _default_models_dir() -> str:
    import importlib.util

    found = importlib.util.find_spec("sglang")  # finds the package without importing it
    if found is None or not found.submodule_search_locations:
        raise SystemExit("audit: sglang is not installed for this python; pass MODELS_DIR")
    return os.path.join(list(found.submodule_search_locations)[0], "srt", "models")


def main(argv: list | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    models_dir = args[0] if args else _default_models_dir()
    package_root = args[1] if len(args) > 1 else None
    json.dump(audit_models(models_dir, package_root), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
