"""Launch profiles: merge, validation before touching a host, flag rendering, secrets."""

import pytest

from provision.errors import ConfigError
from provision.config.playbook import load_playbook
from provision.config.profile import build_profile, render_flags, secrets_from_env


def base():
    pb = load_playbook(None)
    return dict(pb.launch), pb.path


def test_shipped_profile_is_the_published_recipe():
    launch, path = base()
    p = build_profile(launch, path, "kimi")
    flags = render_flags(p.args)
    for token in ["--trust-remote-code", "--tp-size", "8", "--speculative-algorithm", "EAGLE3",
                  "--speculative-draft-model-path", "AQ-MedAI/Kimi-K25-eagle3", "--speculative-num-steps", "3",
                  "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
                  "--mem-fraction-static", "0.9"]:
        assert token in flags
    assert p.port == 30000 and p.tp == 8


def test_host_vars_override_profile():
    launch, path = base()
    p = build_profile(launch, path, "kimi", {"args": {"port": 30001, "model-path": "/data/kimi"},
                                             "python": "/opt/venv/bin/python3"})
    assert p.port == 30001 and p.args["model-path"] == "/data/kimi" and p.python == "/opt/venv/bin/python3"
    assert p.digest() != build_profile(launch, path, "kimi").digest()


@pytest.mark.parametrize("change,needle", [
    ({"speculative-num-steps": None}, "without speculative-num-steps"),
    ({"speculative-algorithm": "MEDUSA"}, "expected one of"),
    ({"speculative-draft-model-path": None}, "needs speculative-draft-model-path"),
    ({"tp-size": "eight"}, "tp-size must be a whole number"),
    ({"mem-fraction-static": 1.5}, "mem-fraction-static"),
    ({"api-key": "s3cret"}, "is a secret"),
    ({"config": "/tmp/x.yaml"}, "managed by provision"),
    ({"Bad Flag": 1}, "not an SGLang flag"),
])
def test_profiles_sglang_would_reject_are_rejected(change, needle):
    launch, path = base()
    args = dict(launch["args"])
    for k, v in change.items():
        if v is None:
            args.pop(k, None)
        else:
            args[k] = v
    launch["args"] = args
    with pytest.raises(ConfigError, match=needle):
        build_profile(launch, path, "kimi")


def test_unset_spec_triplet_is_fine_and_tp_alias():
    launch, path = base()
    args = {k: v for k, v in launch["args"].items() if not k.startswith("speculative-num") and
            k != "speculative-eagle-topk"}
    args["tp"] = 4
    del args["tp-size"]
    launch["args"] = args
    p = build_profile(launch, path, "kimi")
    assert p.tp == 4


def test_flags_and_config_rendering():
    assert render_flags({"a": True, "b": False, "c": None, "d": 3, "e": {"x": 1}}) == ["--a", "--d", "3", "--e",
                                                                                     '{"x": 1}']


def test_secrets_from_env_and_file(tmp_path):
    f = tmp_path / "key"
    f.write_text("from-file\n")
    s = secrets_from_env({"PROVISION_API_KEY": "env-key", "HF_TOKEN": "hf"}, files={"api-key": str(f)})
    assert s == {"args": {"api-key": "from-file"}, "env": {"HF_TOKEN": "hf"}}
    assert secrets_from_env({}) == {"args": {}, "env": {}}


def test_the_record_keeps_the_playbooks_spec_and_a_replay_puts_it_back():
    """A server started with `--playbook kimi-k25-eagle3-vllm` alone (the inventory names no profile):
    its record keeps that playbook's spec by name, and a restart with no --playbook replays it over
    the inventory's (the default playbook's), the profile itself unchanged by the round trip."""
    from provision.config.inventory import Host
    from provision.config.playbook import load_patch_spec
    from provision.config.profile import from_record, host_profile
    from provision.tasks.launch import recorded_launch, recorded_spec

    prof, spec = host_profile(Host("h", {}), "kimi-k25-eagle3-vllm")
    launch = recorded_launch(prof, spec)
    assert launch["spec"] == spec.name == "kimi-k25-eagle3-vllm"
    assert from_record(launch, prof.name, "the record").digest() == prof.digest()  # the spec is not the profile
    default = load_patch_spec(None)
    assert default.name != spec.name
    assert recorded_spec(launch, default) == (spec, "")
    assert recorded_spec(launch, spec)[0] is spec
    assert recorded_spec({}, default) == (default, "")  # a record from before: the inventory's
    kept, why = recorded_spec({"spec": "someone-elses-playbook"}, default)
    assert kept is default and "its spec someone-elses-playbook is not a playbook found on this machine" in why


def test_a_bad_value_is_blamed_on_where_it_came_from():
    """issue 63: `--arg tp-size=eight` blamed the shipped playbook."""
    from provision.config.inventory import Host
    from provision.config.profile import host_profile

    with pytest.raises(ConfigError) as err:
        host_profile(Host("h", {}), None, {"tp-size": "eight"})
    assert err.value.message.startswith("--arg tp-size=eight: tp-size must be a whole number, got 'eight'"), \
        err.value.message
    with pytest.raises(ConfigError) as err:
        host_profile(Host("h", {"args": {"tp-size": -1}}), None)
    assert err.value.message.startswith("the inventory's args: tp-size must be a whole number"), err.value.message


def test_inventory_args_scoped_by_engine_reach_only_that_engines_launches(tmp_path):
    """issue 63: a mixed fleet's `defaults: args:` (SGLang flags) reached vLLM launches. `args:` is
    every engine's; `sglang_args:` and `vllm_args:` each one engine's, over `args:`."""
    import json as _json

    from provision.config.inventory import load_inventory
    from provision.config.profile import host_profile

    inv = tmp_path / "inv.yaml"
    inv.write_text(_json.dumps({"defaults": {"args": {"trust-remote-code": True},
                                             "sglang_args": {"mem-fraction-static": 0.8},
                                             "vllm_args": {"gpu-memory-utilization": 0.8}},
                                "hosts": {"s": {}, "v": {"profile": "kimi-k25-eagle3-vllm"}}}))
    hosts = {h.name: h for h in load_inventory(str(inv)).hosts}
    sg, _ = host_profile(hosts["s"])
    vl, _ = host_profile(hosts["v"])
    assert sg.args["mem-fraction-static"] == 0.8 and "gpu-memory-utilization" not in sg.args
    assert vl.args["gpu-memory-utilization"] == 0.8 and "mem-fraction-static" not in vl.args
    assert sg.args["trust-remote-code"] is True and vl.args["trust-remote-code"] is True
