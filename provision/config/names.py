"""Host names, aliases and users as OpenSSH accepts them: checked before anything uses them (pure).

An inventory value reaches command lines: a ProxyCommand's %r, %h and %n are substituted into a
line the user's shell runs, and a name is an argument of `ssh -G`. Dynamic inventories are built
from cloud tags and CMDB fields, so a name is data from whoever can set a tag. OpenSSH refuses such
names since the CVE-2023-51385 fix (ssh.c valid_hostname / valid_ruser: "hostname contains invalid
characters"); provision refuses the same ones, and more, before any connection or ProxyCommand is
started: a shell metacharacter, a quote, whitespace or a control character anywhere, or a leading
"-" (an option to whatever command it reaches).
"""

from __future__ import annotations

# OpenSSH's set (ssh.c), plus the rest of the shell's own metacharacters and glob characters
SHELL_METACHARACTERS = "'`\"$\\;&<>|(){}*?[]!#~"
MAX_LENGTH = 255  # DNS names are at most 253 characters; Linux user names 32


def problem(value: str) -> str | None:
    """Why `value` cannot be a host name, alias or user; None when it can."""
    if not isinstance(value, str):
        return f"is a {type(value).__name__}, not a name"
    if not value:
        return "is empty"
    if len(value) > MAX_LENGTH:
        return f"is {len(value):,} characters long (a host name or user has at most {MAX_LENGTH})"
    if value.startswith("-"):
        return "starts with '-' (it would be read as an option)"
    for ch in value:
        if ord(ch) < 32 or ord(ch) == 127:
            return f"holds a control character ({ch!r})"
        if ch.isspace():
            return "holds whitespace"
        if ch in SHELL_METACHARACTERS:
            return f"holds the shell metacharacter {ch!r}"
    return None


def refusal(host: str, what: str, value: str) -> str | None:
    """The sentence refusing `value` as `host`'s `what` (its name, address or user); None when fine."""
    why = problem(value)
    if why is None:
        return None
    value = value if len(value) <= 80 else value[:60] + "..."
    host = host if len(host) <= 80 else host[:60] + "..."
    shown = value if what == "name" else f"{value!r} (host {host!r})"
    if what == "name":
        return (f"inventory host {shown!r}: the name {why}; refused before any connection, as OpenSSH "
                "refuses such names (rename the host, or give its address with `address:`)")
    return (f"the {what} {shown} {why}; refused before any connection, as OpenSSH refuses such "
            "names (fix it in the inventory, the ssh config or the flag it came from)")
