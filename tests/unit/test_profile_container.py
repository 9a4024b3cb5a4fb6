"""`launch.container` in a profile (pure): defaults, validation before any host, the run command."""

import pytest

from provision.config.playbook import load_playbook
from provision.config.profile import build_profile, render_flags
from provision.errors import ConfigError
from provision.host.ops.container import host_path, run_argv


def launch_with(container, **args):
    pb = load_playbook(None)
    launch = dict(pb.launch)
    launch["container"] = container
    launch["args"] = {**launch["args"], **args}
    return launch, pb.path


def test_issue_example_is_accepted_and_the_name_defaults_to_the_port():
    launch, path = launch_with({"runtime": "docker", "image": "lmsysorg/sglang:v0.5.9-cu129", "gpus": "all",
                                "ipc": "host", "shm_size": "32g", "network": "host",
                                "volumes": ["/models:/models:ro"], "run_args": []}, port=30001)
    p = build_profile(launch, path, "kimi")
    c = p.container
    assert (c.runtime, c.image, c.name, c.gpus, c.ipc, c.shm_size, c.network) == \
        ("docker", "lmsysorg/sglang:v0.5.9-cu129", "sglang-30001", "all", "host", "32g", "host")
    assert c.volumes == ("/models:/models:ro",)
    # Another container setting is another profile: a running server from the old one is not "the same".
    other = build_profile(launch_with({**c.to_request(), "image": "lmsysorg/sglang:v0.5.10-cu129"})[0], path, "kimi")
    assert other.digest() != p.digest()
    assert build_profile(*launch_with(None), "kimi").container is None


@pytest.mark.parametrize("container,needle", [
    ({"runtime": "containerd", "image": "x"}, "expected one of docker, podman"),
    ({"runtime": "docker"}, "launch.container.image"),
    ({"image": "a b"}, "launch.container.image"),
    ({"image": "x", "name": "-bad name"}, "is not a container name"),
    ({"image": "x", "volumes": ["/models"]}, "expected SRC:DEST"),
    ({"image": "x", "volumes": ["/m:relative"]}, "expected SRC:DEST"),
    ({"image": "x", "shm_size": "lots"}, "shm_size"),
    ({"image": "x", "run_args": ["-e", "HF_TOKEN=hf_x"]}, "run_args: -e"),
    ({"image": "x", "run_args": ["--env=HF_TOKEN=hf_x"]}, "run_args: --env"),
    ({"image": "x", "run_args": ["--name", "other"]}, "run_args: --name"),
    ({"image": "x", "run_args": "--privileged"}, "list of strings"),
    ({"image": "x", "ports": ["30000:30000"]}, "unknown key(s) ports"),
    ("lmsysorg/sglang", "expected a mapping"),
])
def test_bad_container_settings_are_config_errors_naming_the_field(container, needle):
    with pytest.raises(ConfigError) as exc:
        build_profile(*launch_with(container), "kimi")
    assert needle in str(exc.value)
    assert "launch.container" in str(exc.value)


def test_run_command_has_the_options_the_flags_and_no_secret():
    launch, path = launch_with({"runtime": "podman", "image": "img:1", "gpus": "all", "ipc": "host",
                                "shm_size": "32g", "network": "host", "volumes": ["/models:/models:ro"],
                                "run_args": ["--ulimit", "memlock=-1"]})
    p = build_profile(launch, path, "kimi")
    argv = run_argv("/usr/bin/podman", p.container.to_request(), port=30000, digest=p.digest(), python="python3",
                    module="sglang.launch_server", flags=render_flags(p.args), env={"NCCL_DEBUG": "INFO"},
                    mounts=["/var/lib/provision/server/container-30000:/run/provision-secrets:ro"],
                    config_file="/run/provision-secrets/config.yaml")
    assert argv[:5] == ["/usr/bin/podman", "run", "-d", "--name", "sglang-30000"]
    joined = " ".join(argv)
    for part in ("--gpus all", "--ipc host", "--shm-size 32g", "--network host", "-v /models:/models:ro",
                 "-v /var/lib/provision/server/container-30000:/run/provision-secrets:ro", "-e NCCL_DEBUG=INFO",
                 "--ulimit memlock=-1", "--label provision.managed=1", "--label provision.port=30000",
                 f"--label provision.profile={p.digest()}"):
        assert part in joined
    image_at = argv.index("img:1")
    assert argv[image_at + 1:image_at + 3] == ["python3", "-m"]
    assert argv[-2:] == ["--config", "/run/provision-secrets/config.yaml"]
    assert not any("api-key" in a or "HF_TOKEN" in a for a in argv)


@pytest.mark.parametrize("volumes,path,expected", [
    (["/models:/models:ro"], "/models/Kimi-K2.5", "/models/Kimi-K2.5"),
    (["/srv/weights:/models"], "/models/Kimi-K2.5", "/srv/weights/Kimi-K2.5"),
    (["/srv:/models", "/fast/kimi:/models/Kimi-K2.5:ro"], "/models/Kimi-K2.5/x", "/fast/kimi/x"),
    (["/srv:/models"], "/modelsX/a", None),
    (["hf-cache:/root/.cache/huggingface"], "/root/.cache/huggingface/hub", None),  # a named volume
    ([], "/data/m", None),
])
def test_a_container_path_is_found_on_the_host_through_the_volumes(volumes, path, expected):
    assert host_path(volumes, path) == expected


def test_overlay_is_the_default_fix_for_containers_and_edit_is_refused():
    p = build_profile(*launch_with({"image": "lmsysorg/sglang:v0.5.9-cu129"}), "kimi")
    assert p.fix == "overlay"
    assert build_profile(*launch_with(None), "kimi").fix == "edit"  # hosts keep editing the file by default
    launch, path = launch_with({"image": "lmsysorg/sglang:v0.5.9-cu129"})
    launch["fix"] = "edit"
    with pytest.raises(ConfigError) as exc:
        build_profile(launch, path, "kimi")
    assert "launch.fix: edit changes files on the host" in str(exc.value)
