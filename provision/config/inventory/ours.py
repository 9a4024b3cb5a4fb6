"""Our own inventory format (top-level `defaults`, `groups`, `hosts`), strict: an unknown key or
a bad value is an error naming the file and the line. Its YAML is read with the line of each key
(`LineDict`), which the Ansible YAML reader uses too. Pure."""

from __future__ import annotations

from typing import Any

import yaml

from provision.config.inventory.model import GROUP_KEYS, HOST_KEYS, OUR_TOP, Host, Inventory, error_at, merge, spec_vars
from provision.errors import ConfigError


class LineDict(dict):
    """A mapping that remembers the line of each key (1-based)."""

    lines: dict

    def line_of(self, key: Any) -> int | None:
        return getattr(self, "lines", {}).get(key)


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    out = LineDict()
    out.lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:  # `{{}}`, `? [a]`: a mapping or a list used as a key
            raise ConfigError(f"{loader.name}:{key_node.start_mark.line + 1}: a key must be a name, "
                              f"not a {type(key).__name__ if not isinstance(key, dict) else 'mapping'}") from None
        if key in out:
            raise ConfigError(f"{loader.name}:{key_node.start_mark.line + 1}: duplicate key {key!r}")
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
    out.start_line = node.start_mark.line + 1  # type: ignore[attr-defined]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml_with_lines(text: str, path: str) -> Any:
    """``text`` as YAML, every mapping a LineDict (duplicate keys are errors naming the line)."""
    from provision.config.bounded import load_yaml

    def load(t: str) -> Any:
        loader = _Loader(t)
        loader.name = path
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()

    return load_yaml(text, path, load)


def _check_vars(path: str, mapping: Any, where: str, line: int | None) -> dict:
    if mapping is None:
        return {}
    if not isinstance(mapping, dict):
        raise error_at(path, line, f"{where}: expected a mapping of host variables")
    for key, value in mapping.items():
        kline = mapping.line_of(key) if isinstance(mapping, LineDict) else line
        if key not in HOST_KEYS:
            raise error_at(path, kline, f"{where}: unknown key {key!r}; known keys: {', '.join(sorted(HOST_KEYS))}")
        if key == "port" and not (isinstance(value, int) and 0 < value < 65536):
            raise error_at(path, kline, f"{where}.port: expected a port number, got {value!r}")
        if key in ("args", "env", "sglang_args", "vllm_args") and not isinstance(value, dict):
            raise error_at(path, kline, f"{where}.{key}: expected a mapping")
        if key in ("offline", "sudo") and not isinstance(value, bool):
            raise error_at(path, kline, f"{where}.{key}: expected true or false, got {value!r}")
        if key not in ("args", "env", "sglang_args", "vllm_args", "offline", "sudo", "port", "node_rank", "specs",
                       "gpu_capability") \
                and not isinstance(value, str):
            raise error_at(path, kline, f"{where}.{key}: expected a string, got {type(value).__name__}")
    out = {k: _plain(v) for k, v in mapping.items()}
    try:
        return spec_vars(out, where)
    except ConfigError as exc:
        key = "specs" if "specs" in mapping else "gpu_capability"
        at = mapping.line_of(key) if isinstance(mapping, LineDict) else None
        raise error_at(path, at or line, exc.message) from None


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def parse_ours(data: LineDict, path: str) -> Inventory:
    for key in data:
        if key not in OUR_TOP:
            raise error_at(path, data.line_of(key), f"unknown top-level key {key!r}; expected defaults, groups, hosts")
    defaults = _check_vars(path, data.get("defaults"), "defaults", data.line_of("defaults"))
    hosts_raw = data.get("hosts") or LineDict()
    if not isinstance(hosts_raw, dict):
        raise error_at(path, data.line_of("hosts"), "hosts: expected a mapping of host name to variables")
    host_vars: dict[str, dict] = {}
    order: list[str] = []
    for name, hv in hosts_raw.items():
        host_vars[str(name)] = _check_vars(path, hv, f"hosts.{name}", hosts_raw.line_of(name))
        order.append(str(name))
    groups_raw = data.get("groups") or LineDict()
    if not isinstance(groups_raw, dict):
        raise error_at(path, data.line_of("groups"), "groups: expected a mapping of group name to {vars, hosts}")
    membership: dict[str, list[str]] = {}
    group_vars: dict[str, dict] = {}
    for gname, g in groups_raw.items():
        gline = groups_raw.line_of(gname)
        if not isinstance(g, dict):
            raise error_at(path, gline, f"groups.{gname}: expected a mapping with vars and hosts")
        for key in g:
            if key not in GROUP_KEYS:
                raise error_at(path, g.line_of(key), f"groups.{gname}: unknown key {key!r}; expected vars, hosts")
        group_vars[gname] = _check_vars(path, g.get("vars"), f"groups.{gname}.vars", g.line_of("vars"))
        members = g.get("hosts") or []
        if isinstance(members, dict):
            for hname, hv in members.items():
                hv = _check_vars(path, hv, f"groups.{gname}.hosts.{hname}", members.line_of(hname))
                host_vars[str(hname)] = merge(host_vars.get(str(hname), {}), hv)
                if str(hname) not in order:
                    order.append(str(hname))
            members = list(members)
        elif not isinstance(members, list):
            raise error_at(path, g.line_of("hosts"), f"groups.{gname}.hosts: expected a list or mapping of hosts")
        for hname in members:
            membership.setdefault(str(hname), []).append(str(gname))
            if str(hname) not in order:
                order.append(str(hname))
                host_vars.setdefault(str(hname), {})
    hosts = []
    for name in order:
        layers = [defaults] + [group_vars[g] for g in membership.get(name, [])] + [host_vars.get(name, {})]
        hosts.append(Host(name=name, vars=merge(*layers), groups=tuple(membership.get(name, []))))
    if not hosts:
        raise error_at(path, None, "no hosts defined")
    return Inventory(hosts=hosts, path=path)
