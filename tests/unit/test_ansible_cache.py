"""ansible-inventory is asked once per content: a second run on the same bytes reads its cached
answer, which is exactly what ansible-inventory says; an edit anywhere it reads (the inventory,
group_vars/, host_vars/, ansible.cfg, ANSIBLE_* settings) asks it again; a script or plugin
source is asked every run."""

from __future__ import annotations

import os
import shutil
import stat

import pytest

from provision.config import ansible_cache
from provision.config.inventory import load_inventory
from provision.config.inventory.ansible_inventory import _ask_ansible, from_ansible_json

from tests.unit.test_inventory_ansible import INI, _check

REAL = shutil.which("ansible-inventory")
pytestmark = pytest.mark.skipif(not REAL, reason="ansible-core not installed (pip install '.[test]')")


@pytest.fixture
def counted(tmp_path, monkeypatch):
    """ansible-inventory on PATH through a wrapper that counts its runs; returns the counter."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "runs.log"
    wrapper = bindir / "ansible-inventory"
    wrapper.write_text(f"#!/bin/sh\necho run >> {log}\nexec {REAL} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)

    def runs() -> int:
        return len(log.read_text().splitlines()) if log.exists() else 0

    runs.exe = str(wrapper)  # type: ignore[attr-defined]
    return runs


def _same(inv, fresh):
    assert [(h.name, h.vars, h.groups) for h in inv.hosts] == [(h.name, h.vars, h.groups) for h in fresh.hosts]
    assert inv.notes == fresh.notes


def test_an_ini_inventory_is_asked_once_and_the_hit_equals_a_fresh_answer(tmp_path, counted):
    src = tmp_path / "inv" / "hosts"
    src.parent.mkdir()
    src.write_text(INI)
    first = load_inventory(str(src))
    assert counted() == 1
    hit = load_inventory(str(src))
    assert counted() == 1  # the second run did not start ansible-inventory
    _check(hit)
    _same(hit, first)
    _same(hit, from_ansible_json(_ask_ansible(str(src), counted.exe), str(src)))


def test_a_kept_answer_others_could_write_is_not_believed(tmp_path, counted):
    """The cache steers where provision connects: an answer file anyone but its owner could have
    written (group-writable here) is asked again, as is one replaced by a symlink."""
    src = tmp_path / "inv" / "hosts"
    src.parent.mkdir()
    src.write_text(INI)
    load_inventory(str(src))
    kept = list((tmp_path / "cache" / "provision" / "ansible-inventory").iterdir())
    assert len(kept) == 1 and (kept[0].stat().st_mode & 0o777) == 0o600
    kept[0].chmod(0o664)
    load_inventory(str(src))
    assert counted() == 2, "a group-writable answer was believed"
    kept[0].chmod(0o600)
    load_inventory(str(src))
    assert counted() == 2
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(kept[0].read_bytes())
    kept[0].unlink()
    kept[0].symlink_to(elsewhere)
    load_inventory(str(src))
    assert counted() == 3, "a symlinked answer was believed"


def test_a_directory_with_group_vars_host_vars_and_yaml(tmp_path, counted):
    d = tmp_path / "inv"
    (d / "group_vars").mkdir(parents=True)
    (d / "host_vars").mkdir()
    (d / "hosts.ini").write_text("[gpus]\ngpu[1:2]\n")
    (d / "more.yml").write_text("all:\n  children:\n    gpus:\n      hosts:\n        gpu3: {ansible_port: 2203}\n")
    (d / "group_vars" / "gpus.yml").write_text("ansible_user: ops\n")
    (d / "host_vars" / "gpu2.yml").write_text("ansible_port: 2202\n")
    first = load_inventory(str(d))
    hit = load_inventory(str(d))
    assert counted() == 1
    _same(hit, first)
    _same(hit, from_ansible_json(_ask_ansible(str(d), counted.exe), str(d)))
    by = {h.name: h.vars for h in hit.hosts}
    assert by["gpu1"]["user"] == "ops" and by["gpu2"]["port"] == 2202 and by["gpu3"]["port"] == 2203

    # an edit of a group_vars file is seen at once, and then cached in turn
    (d / "group_vars" / "gpus.yml").write_text("ansible_user: deploy\n")
    edited = load_inventory(str(d))
    assert counted() == 3 and {h.vars["user"] for h in edited.hosts} == {"deploy"}
    load_inventory(str(d))
    assert counted() == 3
    # a new host_vars file too
    (d / "host_vars" / "gpu1.yml").write_text("ansible_port: 2201\n")
    assert {h.name: h.vars.get("port") for h in load_inventory(str(d)).hosts}["gpu1"] == 2201
    assert counted() == 4


def test_group_vars_next_to_an_inventory_file_and_the_ansible_config_are_part_of_the_key(tmp_path, counted,
                                                                                        monkeypatch):
    d = tmp_path / "inv"
    (d / "group_vars").mkdir(parents=True)
    src = d / "hosts.yml"
    src.write_text("all:\n  hosts:\n    h1: {}\n")
    (d / "group_vars" / "all.yml").write_text("ansible_user: one\n")
    assert load_inventory(str(src)).hosts[0].vars["user"] == "one"
    (d / "group_vars" / "all.yml").write_text("ansible_user: two\n")
    assert load_inventory(str(src)).hosts[0].vars["user"] == "two"
    assert counted() == 2
    # the config Ansible uses (./ansible.cfg here) and its ANSIBLE_* settings are read too
    load_inventory(str(src))
    assert counted() == 2
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    load_inventory(str(src))
    assert counted() == 3
    monkeypatch.setenv("ANSIBLE_CONFIG", str(tmp_path / "other.cfg"))
    load_inventory(str(src))
    assert counted() == 4


def test_an_inventory_script_is_asked_every_run(tmp_path, counted):
    script = tmp_path / "inv.py"
    n = tmp_path / "n"
    n.write_text("0")
    script.write_text(
        "#!/bin/sh\n"
        f"i=$(($(cat {n}) + 1)); echo $i > {n}\n"
        "if [ \"$1\" = --list ]; then\n"
        "  echo '{\"all\": {\"hosts\": [\"h'$i'\"]}, \"_meta\": {\"hostvars\": {}}}'\n"
        "else echo '{}'; fi\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    assert [h.name for h in load_inventory(str(script)).hosts] == ["h1"]
    assert [h.name for h in load_inventory(str(script)).hosts] == ["h2"]
    assert counted() == 2


def test_a_failed_answer_is_not_cached(tmp_path, counted):
    from provision.errors import ConfigError

    p = tmp_path / "inventory.ini"
    p.write_text("[gpus]\ngpu01 ansible_port=ssh\n")
    for _ in range(2):
        with pytest.raises(ConfigError):
            load_inventory(str(p))
    # the bad value is ours to refuse: ansible-inventory's answer was fine and is cached
    p.write_text("[gpus\n")
    for _ in range(2):
        with pytest.raises(ConfigError):
            load_inventory(str(p))
    assert counted() == 3


def test_key_is_pure_and_names_every_input(tmp_path):
    src = tmp_path / "hosts"
    src.write_text("h1\n")
    exe = shutil.which("ansible-inventory")
    base = ansible_cache.key(str(src), exe, env={}, cwd=str(tmp_path))
    assert ansible_cache.key(str(src), exe, env={}, cwd=str(tmp_path)) == base
    assert ansible_cache.key(str(src), exe, env={"ANSIBLE_INVENTORY_ENABLED": "ini"}, cwd=str(tmp_path)) != base
    assert ansible_cache.key(str(src), exe, env={"UNRELATED": "x"}, cwd=str(tmp_path)) == base
    (tmp_path / "host_vars").mkdir()
    with_dir = ansible_cache.key(str(src), exe, env={}, cwd=str(tmp_path))
    assert with_dir != base
    (tmp_path / "host_vars" / "h1").write_text("a: 1\n")
    assert ansible_cache.key(str(src), exe, env={}, cwd=str(tmp_path)) != with_dir
    plugin = tmp_path / "aws_ec2.yml"
    plugin.write_text("plugin: amazon.aws.aws_ec2\nregions: [eu-west-1]\n")
    with pytest.raises(ansible_cache.Dynamic):
        ansible_cache.key(str(plugin), exe, env={}, cwd=str(tmp_path))
