"""Pure configuration: YAML/INI in, validated objects out (inventory, playbooks, launch profiles)."""
