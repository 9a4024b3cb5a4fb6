"""What pyproject.toml cannot say: the shipped playbooks live at the top level (playbooks/)
and install inside the package, as provision/playbooks/, where importlib.resources finds them
(provision/config/playbook.py) from pip, pip --user, pipx and uv tool installs alike."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["provision", "provision.*"]) + ["provision.playbooks"],
    package_dir={"provision.playbooks": "playbooks"},
    package_data={"provision.playbooks": ["*.yaml", "containers/*"]},
)
