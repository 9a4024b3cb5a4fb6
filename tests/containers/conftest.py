"""Fixtures for container hosts: podman on a namespace sandbox host, and the SGLang images.

  sglang_images  session: {version: tag} of the SGLang images laid out as the official ones
                 (provision/sandbox/sglang_image.py), built when absent (.ci/run builds them).
  podman_host    module: a namespace sandbox host with podman set up (its own
                 /etc/containers, the images' store mounted read-only), no SGLang of its own;
                 reset before each test (its containers removed).
"""

from __future__ import annotations

import pytest

IMAGE_VERSIONS = ("0.5.9", "0.5.10")


@pytest.fixture(scope="session")
def sglang_images():
    from provision.sandbox import images, sglang_image

    bad = images.problems()
    if bad:
        pytest.skip("container images unavailable: " + "; ".join(bad))
    return {v: sglang_image.ensure_sglang_image(v)[0] for v in IMAGE_VERSIONS}


@pytest.fixture(scope="module")
def podman_host_module(sandbox_factory, sglang_images, request):
    from provision.sandbox.hosts import HostSpec

    tag = "".join(c for c in request.module.__name__.rsplit(".", 1)[-1] if c.isalnum())[-10:]
    sandbox_factory._count += 1
    spec = HostSpec(f"pm-{tag}{sandbox_factory._count}", "auto", None, "none", sandbox_factory.port, podman=True)
    host = sandbox_factory.up(spec)[0]
    try:
        yield host
    finally:
        sandbox_factory.remove(host)


@pytest.fixture
def podman_host(podman_host_module):
    podman_host_module.reset()
    return podman_host_module
