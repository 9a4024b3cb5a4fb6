"""The pure and local parts of a server's lifecycle: which processes are provably provision's,
log pruning by age, the secrets a restart keeps, the port's lock, redaction of other containers'
command lines."""

from __future__ import annotations

import json
import fnmatch
import os
import threading
import time

import pytest

from provision.host.facts.containers import parse_ps
from provision.host.ops import server_secrets
from provision.host.ops.backends import identity, lock, tree

# {pid: (ppid, starttime)}
TABLE = {1: (0, "1"), 100: (1, "500"), 101: (100, "510"), 102: (101, "520"), 103: (1, "530"),
         200: (1, "900"), 201: (200, "901")}


def test_a_process_is_ours_by_pid_and_start_time_or_by_descent():
    anchors = [{"pid": 100, "starttime": "500"}]
    assert identity.descendants_of(anchors, TABLE) == [100, 101, 102]
    # an orphan re-parented to init is not provably ours, nor anything else
    assert 103 not in identity.descendants_of(anchors, TABLE)


def test_a_reused_pid_number_is_not_ours():
    # pid 200 was the server's; the kernel gave the number to something that started later
    assert identity.descendants_of([{"pid": 200, "starttime": "700"}], TABLE) == []


def test_a_record_of_a_stopped_server_or_another_boot_owns_nothing(monkeypatch):
    rec = {"pid": 100, "starttime": "500", "watcher": 1, "watcher_starttime": "x"}
    monkeypatch.setattr(identity, "boot_id", lambda: "boot-now")
    assert identity.owned(dict(rec, boot_id="boot-now"), TABLE) == [100, 101, 102]
    assert identity.owned(dict(rec, boot_id="boot-before"), TABLE) == []
    assert identity.owned(dict(rec, boot_id="boot-now", stopped_at=1.0), TABLE) == []
    assert identity.owned({"pid": 100, "starttime": None}, TABLE) == []  # no start time: not provable


def test_a_parent_loop_in_the_table_ends():
    table = {5: (6, "1"), 6: (5, "2"), 7: (6, "3"), 8: (9, "4"), 9: (8, "5")}
    assert identity.descendants_of([{"pid": 5, "starttime": "1"}], table) == [5, 6, 7]


def test_this_process_is_ours_by_its_identity():
    me = identity.ident(os.getpid())
    assert me and identity.matches(me["pid"], me["starttime"]) and not identity.matches(me["pid"], "1")


def test_pruning_keeps_the_current_log_of_two_launches_in_one_second(tmp_path):
    old = tmp_path / "sglang-30000-20260101-091035.log"
    cur = tmp_path / "sglang-30000-20260101-091035-2.log"  # sorts before the older one by name
    old.write_text("first")
    cur.write_text("second")
    os.utime(old, (time.time() - 5, time.time() - 5))
    assert tree.prune_logs(str(tmp_path), "sglang-30000-*.log", 1, str(cur)) == [str(old)]
    assert cur.exists() and not old.exists()


def test_pruning_never_removes_the_current_log_even_if_it_is_the_oldest(tmp_path):
    paths = [tmp_path / f"sglang-30000-2026010{i}-000000.log" for i in range(1, 4)]
    for i, p in enumerate(paths):
        p.write_text(str(i))
        os.utime(p, (1000 + i, 1000 + i))
    gone = tree.prune_logs(str(tmp_path), "sglang-30000-*.log", 1, str(paths[0]))
    assert paths[0].exists() and sorted(gone) == sorted(map(str, paths[1:2]))


def test_each_engine_prunes_its_own_logs_of_the_port():
    from provision.host import inference

    assert inference.get("vllm").log_glob(30000) == "vllm-30000-*.log"
    assert fnmatch.fnmatch(inference.get("vllm").log_name(30000, "20261205-070000", 2),
                           inference.get("vllm").log_glob(30000))
    assert not fnmatch.fnmatch(inference.get("sglang").log_name(30000, "20261205-070000"),
                               inference.get("vllm").log_glob(30000))


def test_secret_config_round_trips():
    args = {"api-key": 'k"e y', "admin-api-key": "adm"}
    text = server_secrets.render_config(args)
    assert server_secrets.parse_config(text) == args


def _old(tmp_path, **kw):
    cfg = tmp_path / "server-30000.secrets.yaml"
    cfg.write_text(server_secrets.render_config({"api-key": "sk-old"}))
    tok = tmp_path / "server-30000.hf_token"
    tok.write_text("hf_old")
    return dict({"pid": 1, "config": str(cfg), "secrets": {"args": ["api-key"], "env": ["HF_TOKEN"],
                                                           "files": {"api-key": str(cfg), "HF_TOKEN": str(tok)}}},
                **kw)


def test_a_restart_without_the_key_keeps_the_hosts_key(tmp_path):
    secrets, why = server_secrets.keep_for_restart({"restart": True, "secrets": {"args": {}, "env": {}}},
                                                   _old(tmp_path))
    assert why is None and secrets == {"args": {"api-key": "sk-old"}, "env": {"HF_TOKEN": "hf_old"}}


def test_this_runs_secret_wins_over_the_hosts(tmp_path):
    secrets, why = server_secrets.keep_for_restart(
        {"restart": True, "secrets": {"args": {"api-key": "sk-new"}, "env": {}}}, _old(tmp_path))
    assert why is None and secrets["args"] == {"api-key": "sk-new"}


def test_a_restart_that_cannot_keep_the_key_is_refused_naming_variable_and_file(tmp_path):
    old = _old(tmp_path)
    os.unlink(old["config"])
    _, why = server_secrets.keep_for_restart({"restart": True, "secrets": {}}, old)
    assert why and "PROVISION_API_KEY" in why and old["config"] in why and "keeps running" in why


@pytest.mark.parametrize("req,kw", [({"secrets": {}}, {}), ({"restart": True, "secrets": {}}, {"stopped_at": 1.0})])
def test_a_fresh_launch_or_a_stopped_record_keeps_nothing(tmp_path, req, kw):
    secrets, why = server_secrets.keep_for_restart(req, _old(tmp_path, **kw))
    assert why is None and secrets == {"args": {}, "env": {}}


def test_the_token_goes_only_into_its_0600_file(tmp_path):
    req = {"state_dir": str(tmp_path)}
    cfg, token, files = server_secrets.write_host_files(req, 30000, {"args": {"api-key": "sk-1"},
                                                                     "env": {"HF_TOKEN": "hf_x"}})
    assert open(token).read() == "hf_x" and os.stat(token).st_mode & 0o777 == 0o600
    assert os.stat(cfg).st_mode & 0o777 == 0o600 and files == {"api-key": cfg, "HF_TOKEN": token}


def test_a_second_holder_waits_then_is_refused_naming_the_first(tmp_path):
    held, release = threading.Event(), threading.Event()

    def first():
        with lock.port_lock(str(tmp_path), 30000, "start"):
            held.set()
            release.wait(10)

    t = threading.Thread(target=first)
    t.start()
    held.wait(5)
    try:
        with pytest.raises(lock.Busy) as exc:
            with lock.port_lock(str(tmp_path), 30000, "stop", wait=0.3):
                pass
        msg = str(exc.value)
        assert f"pid {os.getpid()}" in msg and "doing `start`" in msg and "server-30000.lock" in msg
    finally:
        release.set()
        t.join()
    with lock.port_lock(str(tmp_path), 30000, "stop", wait=0.3):  # free again
        pass


def test_other_containers_api_keys_do_not_reach_status():
    ps = json.dumps({"Names": "other", "ID": "abc", "Image": "lmsysorg/sglang",
                     "Command": '"python3 -m sglang.launch_server --model-path /m --api-key sk-other-9 --port 30001"',
                     "State": "running"})
    [c] = parse_ps("docker", ps)
    assert "sk-other-9" not in json.dumps(c) and c["port"] == 30001 and "--api-key" in c["command"]
