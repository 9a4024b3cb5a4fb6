"""Mask secrets in text before it is shown or stored (pure; no IO).  STDLIB ONLY: the one redactor
of both sides (the host's facts redact other servers' command lines with it; provision.logs.redact
is this module, for the control side).

SGLang logs its secrets: ``server_args=ServerArgs(..., api_key='...', admin_api_key='...')``.
Anything that prints a server log, a command line or a crash report goes through :func:`redact`.
"""

from __future__ import annotations

import re
from typing import Iterable

MASK = "***"

_QUOTED_OR_BARE = r"""(?:'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"|[^\s,;)&'"\[\]]+)"""
# a value that is a list or tuple of them: vLLM 0.16 logs `non-default args: {'api_key': ['KEY']}`
_SEQUENCE = r"""(?:\[\s*""" + _QUOTED_OR_BARE + r"""?(?:\s*,\s*""" + _QUOTED_OR_BARE + r""")*\s*,?\s*\]""" \
    r"""|\(\s*""" + _QUOTED_OR_BARE + r"""?(?:\s*,\s*""" + _QUOTED_OR_BARE + r""")*\s*,?\s*\))"""
_VALUE = "(?:" + _SEQUENCE + "|" + _QUOTED_OR_BARE + ")"

# api_key='x' / admin_api_key="x" / hf_token=x (Python reprs, key=value lists, URLs)
_KEY_EQ = re.compile(
    r"""(?P<key>(?<![A-Za-z0-9])(?:admin_api_key|api_key|hf_token|api-key|admin-api-key|hf-token))"""
    r"""(?P<sep>\s*=\s*)(?P<val>""" + _VALUE + ")",
    re.IGNORECASE,
)
# --api-key X / --api-key=X / --admin-api-key X / --hf-token X
_FLAG = re.compile(
    r"""(?P<key>--(?:admin-api-key|api-key|hf-token|admin_api_key|api_key|hf_token))"""
    r"""(?P<sep>\s+|=)(?P<val>""" + _QUOTED_OR_BARE + ")",
    re.IGNORECASE,
)
# YAML / JSON: api-key: X, "api_key": "X"
_MAPPING = re.compile(
    r"""(?P<key>["']?(?<![A-Za-z0-9_-])(?:admin[-_]api[-_]key|api[-_]key|hf[-_]token)["']?)"""
    r"""(?P<sep>\s*:\s*)(?P<val>""" + _VALUE + ")",
    re.IGNORECASE,
)
# a URL's password: scheme://user:SECRET@host
_URL_USERINFO = re.compile(r"""(?P<key>\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@'"]*)(?P<sep>:)(?P<val>[^@\s/'"]+)(?=@)""")
# Authorization: Bearer X (headers, curl -H, JSON header dicts) and any bare "Bearer X"
_BEARER = re.compile(r"""(?P<key>\bBearer)(?P<sep>\s+)(?P<val>[^\s"',;]+)""", re.IGNORECASE)
# HF_TOKEN=X and friends (environment assignments, `env` dumps, export lines)
_ENV = re.compile(
    r"""(?P<key>(?<![A-Za-z0-9_])(?:HF_TOKEN|HUGGING_FACE_HUB_TOKEN|HUGGINGFACE_HUB_TOKEN|HUGGINGFACE_TOKEN"""
    r"""|SGLANG_API_KEY|OPENAI_API_KEY|HF_API_TOKEN))(?P<sep>\s*=\s*)(?P<val>""" + _QUOTED_OR_BARE + ")",
)
# A Hugging Face access token wherever it appears
_HF_TOKEN_VALUE = re.compile(r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{20,}")

_NOT_SECRET = {"none", "null", "''", '""', MASK, f"'{MASK}'", f'"{MASK}"', ""}


def _mask_value(val: str) -> str:
    if val.lower() in _NOT_SECRET:
        return val
    if len(val) >= 2 and (val[0], val[-1]) in (("[", "]"), ("(", ")")):  # a list of them: every item masked
        inner = val[1:-1].strip()
        return val[0] + (_mask_value(inner.split(",")[0].strip()) if inner else "") + val[-1]
    if len(val) >= 2 and val[0] == val[-1] and val[0] in "'\"":
        return f"{val[0]}{MASK}{val[0]}"
    return MASK


def _sub(pattern: re.Pattern, text: str) -> str:
    return pattern.sub(lambda m: m.group("key") + m.group("sep") + _mask_value(m.group("val")), text)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """Replace every known secret value (len >= 4) with ``***`` and always mask the usual
    secret-carrying patterns (``api_key='...'``, ``admin_api_key=...``, ``hf_token=...``,
    ``--api-key X``, ``Authorization: Bearer X``, ``HF_TOKEN=X``, YAML/JSON ``api-key: X``, a list
    or tuple of values ``'api_key': ['X']``, a URL's ``user:X@``), even when the value is not known."""
    if not text:
        return text
    known = sorted({s for s in secrets if isinstance(s, str) and len(s) >= 4}, key=len, reverse=True)
    for secret in known:
        text = text.replace(secret, MASK)
    for pattern in (_FLAG, _KEY_EQ, _MAPPING, _BEARER, _ENV, _URL_USERINFO):
        text = _sub(pattern, text)
    text = _HF_TOKEN_VALUE.sub(MASK, text)
    return text


def redact_argv(argv: Iterable[str], secrets: Iterable[str] = ()) -> list[str]:
    """Redact a command line given as a list (``--api-key`` and its value are separate items)."""
    out: list[str] = []
    hide_next = False
    for item in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        if re.fullmatch(r"--(?:admin-api-key|api-key|hf-token|admin_api_key|api_key|hf_token)", item, re.I):
            hide_next = True
            out.append(item)
            continue
        out.append(redact(item, secrets))
    return out


def redact_doc(doc, secrets: Iterable[str] = ()):
    """A JSON-able document with every string in it (values and keys) through ``redact``: the
    ``--json`` output's last stop. Pure; the structure is kept."""
    known = list(secrets)
    if isinstance(doc, str):
        return redact(doc, known)
    if isinstance(doc, dict):
        return {redact_doc(k, known) if isinstance(k, str) else k: redact_doc(v, known) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [redact_doc(v, known) for v in doc]
    return doc

