"""`schedule --install` on a systemd control machine: provision pip-installed into Debian's
python inside a systemd host, its timer re-patching a host an "upgrade" wiped, and the cron
line run as a user the way cron runs it."""

from __future__ import annotations

import shutil

import pytest

from tests.cli.helpers import KIMI, KIMI_CLASS, METHODS, class_methods, run_json
from tests.systemd.conftest import install_provision

pytestmark = pytest.mark.ssh

OPS_LOG = "/home/ops/.local/state/provision/reconcile.log"
UNITS = "/etc/systemd/system/provision-reconcile.service /etc/systemd/system/provision-reconcile.timer"


def _methods(host) -> list[str]:
    return class_methods(host.hostpath(f"{host.sglang_dir}/{KIMI}").read_bytes(), KIMI_CLASS)


def _control_files(host, ssh_env, home: str, owner: str = "root") -> str:
    """Key, known_hosts and an inventory (of the host itself) in HOME/ctl inside the host."""
    ctl = host.hostpath(f"{home}/ctl")
    ctl.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ssh_env.identity, ctl / "id_ed25519")
    (ctl / "id_ed25519").chmod(0o600)
    shutil.copyfile(ssh_env.known_hosts, ctl / "known_hosts")
    (ctl / "inv.yaml").write_text(f"hosts:\n  {host.name}: {{address: {host.address}, port: {host.port}}}\n")
    host.run(f"chown -R {owner}: {home}/ctl")
    return f"-i {home}/ctl/inv.yaml --identity {home}/ctl/id_ed25519 --known-hosts {home}/ctl/known_hosts"


def test_timer_repatches_a_wiped_host_and_the_cron_line_works_for_a_user(tmp_path, ssh_env, systemd_host,
                                                                         wheelhouse):
    host = systemd_host
    exe = install_provision(host, wheelhouse)
    assert exe == "/usr/local/bin/provision"
    # A system-wide, non-editable install finds its shipped playbooks.
    where = host.run("cd / && python3 -c 'import provision.config.playbook as p; p.load_patch_spec(None); "
                     "print(p.PACKAGE_PLAYBOOKS)'").stdout.strip()
    assert where.startswith("/usr/local/lib/python3") and where.endswith("/provision/playbooks"), where

    inv = ssh_env.inventory(tmp_path / "inv.yaml", [host])
    assert run_json("patch", "-i", inv)[1]["hosts"][0]["verdict"] == "patched"
    host.reset_sglang()  # an "upgrade": the pristine release reinstalled over our patch
    assert not set(METHODS) & set(_methods(host))

    args = _control_files(host, ssh_env, "/root")
    out = host.run(f"provision schedule {args} --every 15m --install").stdout
    assert "wrote /etc/systemd/system/provision-reconcile.timer" in out
    verify = host.run(f"systemd-analyze verify {UNITS}", check=False)
    assert verify.returncode == 0 and "provision-reconcile" not in verify.stdout + verify.stderr, \
        verify.stdout + verify.stderr
    host.run("systemctl daemon-reload && systemctl enable --now provision-reconcile.timer")
    assert host.run("systemctl is-enabled provision-reconcile.timer").stdout.strip() == "enabled"
    assert host.run("systemctl is-active provision-reconcile.timer").stdout.strip() == "active"
    host.run("systemctl start provision-reconcile.service", timeout=300)
    props = host.run("systemctl show -p Result,ExecMainStatus provision-reconcile.service").stdout
    assert "Result=success" in props and "ExecMainStatus=0" in props, props
    assert set(METHODS) <= set(_methods(host))
    journal = host.run("journalctl -u provision-reconcile.service --no-pager -o cat").stdout
    assert "wiped" in journal or "patched" in journal, journal

    # The cron line, for a user who is not root, with their own `pip install --user` (another
    # layout the shipped playbooks must be found in): logs under their home, not /var/log.
    host.run("id ops >/dev/null 2>&1 || useradd -m ops")
    args = _control_files(host, ssh_env, "/home/ops", owner="ops")
    as_ops = "runuser -u ops -- env -i HOME=/home/ops LOGNAME=ops SHELL=/bin/sh PATH=/usr/bin:/bin"
    host.run("rm -rf /home/ops/wheelhouse && cp -r /root/wheelhouse /home/ops/ && chown -R ops: /home/ops/wheelhouse")
    host.run(f"{as_ops} python3 -m pip install -q --disable-pip-version-check --user --break-system-packages "
             "--ignore-installed --no-deps --no-index --find-links /home/ops/wheelhouse provision", timeout=300)
    user_exe = "/home/ops/.local/bin/provision"
    where = host.run(f"cd / && {as_ops} python3 -c 'import provision.config.playbook as p; p.load_patch_spec(None); "
                     "print(p.PACKAGE_PLAYBOOKS)'").stdout.strip()
    assert where.startswith("/home/ops/.local/lib/python3") and where.endswith("/provision/playbooks"), where
    printed = host.run(f"cd /home/ops && {as_ops} {user_exe} schedule {args} --every 15m").stdout
    cron = next(line for line in printed.splitlines() if line.startswith("*/15 * * * * "))
    assert f"*/15 * * * * mkdir -p /home/ops/.local/state/provision && {user_exe} reconcile " in cron
    assert "/var/log" not in cron and ">>/home/ops/.local/state/provision/reconcile.log" in cron
    host.reset_sglang()
    command = cron.split(" ", 5)[5].replace("\\%", "%")
    done = host.run([*as_ops.split(), "/bin/sh", "-c", command], check=False, timeout=300)  # as cron would
    assert done.returncode == 0, done.stdout + done.stderr
    log = host.hostpath(OPS_LOG)
    assert host.run(f"stat -c %U {OPS_LOG}").stdout.strip() == "ops"
    assert "wiped" in log.read_text() or "patched" in log.read_text(), log.read_text()
    assert set(METHODS) <= set(_methods(host))
