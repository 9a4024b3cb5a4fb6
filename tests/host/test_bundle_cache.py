"""The host keeps the bundle it was sent (<state dir>/bundles/SHA256, 0700 dir, 0600 file) and
runs it from there only when its bytes hash to the name: a second call sends the request alone,
a tampered or foreign copy is never run, and the answer is the same either way."""

from __future__ import annotations

import hashlib
import json
import os
import stat

from provision.control.transport.bundle import bundle_bytes, bundle_digest, bundle_source
from provision.control.transport.local import LocalTransport


class Counting(LocalTransport):
    """The local transport, counting what goes to the step (command line and stdin)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.sent: list[int] = []

    def _channel(self, command, timeout):
        chan = super()._channel(command, timeout)
        box = [len(command.encode())]
        self.sent.append(box)
        send = chan.send

        def counted(data):
            n = send(data)
            box[0] += n
            return n

        chan.send = counted  # type: ignore[method-assign]
        return chan


def _call(t: Counting, tmp_path, op="backups") -> dict:
    return t.call({"op": op, "file": str(tmp_path / "x.py")})


def test_the_second_call_sends_the_request_alone_and_answers_the_same(tmp_path):
    state = tmp_path / "state"
    t = Counting("here", state_dir=str(state)).open()
    first = _call(t, tmp_path)
    assert t.last_said == "miss" and first["ok"] is True
    copy = state / "bundles" / bundle_digest()
    # kept as the sources themselves: a hit pays a sha256, never a decompression
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == bundle_digest()
    assert copy.read_bytes() == bundle_source()
    assert stat.S_IMODE(os.stat(state / "bundles").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700  # the state dir too, when this call made it
    assert stat.S_IMODE(os.stat(copy).st_mode) == 0o600 and os.stat(copy).st_uid == os.geteuid()
    second = _call(t, tmp_path)
    assert t.last_said == "hit" and second == first
    miss_bytes, hit_bytes = t.sent[0][0], t.sent[1][0]
    assert miss_bytes > len(bundle_bytes()) and hit_bytes < 2048, (miss_bytes, hit_bytes)


def test_a_tampered_copy_is_never_run_and_is_replaced(tmp_path):
    state = tmp_path / "state"
    t = Counting("here", state_dir=str(state)).open()
    _call(t, tmp_path)
    copy = state / "bundles" / bundle_digest()
    # a copy that would answer differently if it were run
    mods = json.loads(copy.read_bytes())
    mods["provision.host.agent"] = "def main(q, b):\n    print('PROVISION-RESULT {\"ok\": \"tampered\"}')\n"
    copy.write_bytes(json.dumps(mods).encode())
    ans = _call(t, tmp_path)
    assert t.last_said == "miss" and ans["ok"] is True
    assert copy.read_bytes() == bundle_source()
    _call(t, tmp_path)
    assert t.last_said == "hit"


def test_a_directory_open_to_others_is_not_used(tmp_path):
    state = tmp_path / "state"
    (state / "bundles").mkdir(parents=True)
    os.chmod(state / "bundles", 0o777)
    t = Counting("here", state_dir=str(state)).open()
    for _ in range(2):
        assert _call(t, tmp_path)["ok"] is True
        assert t.last_said == "miss"
    assert list((state / "bundles").iterdir()) == []  # nothing written into it either


def test_a_lighter_bundle_is_kept_beside_the_full_one(tmp_path):
    state = tmp_path / "state"
    t = Counting("here", state_dir=str(state)).open()
    light = frozenset({"ops.server", "ops.audit", "engine.audit"})
    t.call({"op": "backups", "file": str(tmp_path / "x.py")}, exclude=light)
    _call(t, tmp_path)
    kept = sorted(p.name for p in (state / "bundles").iterdir() if len(p.name) == 64)
    assert kept == sorted([bundle_digest(light), bundle_digest()])
    t.call({"op": "backups", "file": str(tmp_path / "x.py")}, exclude=light)
    assert t.last_said == "hit"



def test_compiled_modules_are_kept_and_a_corrupt_copy_of_them_is_ignored(tmp_path):
    import sys

    state = tmp_path / "state"
    t = Counting("here", state_dir=str(state)).open()
    first = _call(t, tmp_path)
    _call(t, tmp_path)  # the first hit compiles what it runs and keeps it
    code = state / "bundles" / f"{bundle_digest()}.{sys.implementation.cache_tag}"
    assert code.is_file() and stat.S_IMODE(os.stat(code).st_mode) == 0o600
    assert _call(t, tmp_path) == first
    blob = bytearray(code.read_bytes())
    blob[100] ^= 0xFF
    code.write_bytes(bytes(blob))
    assert _call(t, tmp_path) == first and t.last_said == "hit"
