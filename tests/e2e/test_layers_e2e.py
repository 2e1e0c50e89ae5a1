"""Built images, layer by layer: no certificate of the host's CA bundle that the image's own
trust stores lack, no leftovers of the install steps' mounts, slim a prefix of runtime."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest
from helpers import private_matrix, remove_images_of, run_builder

from builder.core import engine, proc

pytestmark = pytest.mark.docker

SLIM = "2.13.0-py3.11-cpu-slim"
RUNTIME = "2.13.0-py3.11-cpu-runtime"
PEM = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory):
    """A state folder and an image repository of this module's own, removed afterwards: the
    user's `.state/` and images are never touched (#25)."""
    tmp = tmp_path_factory.mktemp("layers")
    matrix = private_matrix(tmp)
    yield {"matrix": matrix, "env": {**os.environ, "BUILDER_STATE": str(tmp / "state")}}
    remove_images_of(matrix)


@pytest.fixture(scope="module")
def built(private):
    """vid → its image, built once (without smoke or SBOM: these tests read layers)."""
    made: dict[str, str] = {}

    def build(vid: str) -> str:
        if vid not in made:
            run_builder("build", "--select", f"id={vid}", "--no-smoke", "--no-sbom",
                        matrix=private["matrix"], env=private["env"])
            out = run_builder("plan", "--offline", "--json", "--select", f"id={vid}",
                              matrix=private["matrix"], env=private["env"]).stdout
            made[vid] = json.loads(out)["include"][0]["image"]
        return made[vid]

    return build


def layer_members(ref: str):
    """(layer index, member name, bytes) for every regular file of every layer."""
    saved = subprocess.run([engine.client(), "save", ref], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(saved)) as image:
        manifest = json.load(image.extractfile("manifest.json"))
        for i, name in enumerate(manifest[0]["Layers"]):
            with tarfile.open(fileobj=image.extractfile(name)) as layer:
                for member in layer:
                    data = layer.extractfile(member).read() if member.isfile() else b""
                    yield i, member.name.removeprefix("./"), data  # imported bases: ./etc/…


def test_no_layer_holds_the_host_ca_bundle_or_mount_leftovers(built):
    host_ca = proc.host_ca_bundle()
    if host_ca is None:
        pytest.skip("no host CA bundle")
    ref = built(SLIM)
    members = list(layer_members(ref))
    # The trust stores the image ships by itself (Debian's and certifi's): what the host trusts
    # beyond them (a TLS-intercepting proxy's CA) must appear nowhere.
    shipped = {cert for _, n, d in members
               if n == "etc/ssl/certs/ca-certificates.crt" or n.endswith("certifi/cacert.pem")
               for cert in PEM.findall(d)}
    host_only = set(PEM.findall(Path(host_ca).read_bytes())) - shipped
    for i, name, data in members:
        assert not any(cert in data for cert in host_only), f"layer {i}: {name}"
        assert not name.startswith("mnt/build/") or not data, f"layer {i}: {name}"
    if not host_only:
        pytest.skip("the host trusts nothing the image does not: nothing to look for")


def test_slim_layers_are_a_prefix_of_runtime(built):
    def layers(ref: str) -> list[str]:
        return (engine.inspect_image(ref) or {})["RootFS"]["Layers"]

    slim, runtime = layers(built(SLIM)), layers(built(RUNTIME))
    shared = slim[:-3]  # the per-image tail: smoke suite and its node check, facts, WORKDIR
    assert runtime[:len(shared)] == shared and len(shared) >= 4
