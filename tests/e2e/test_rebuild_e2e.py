"""The security rebuild for real: publish an image, change nothing → `rebuild --check` exits 0 and
`rebuild` pushes nothing; rebuild its base with one more package → `rebuild --check` names
`base-moved`, `rebuild` publishes a new dated tag, moves the floating tag and prints the SBOM diff.

Like tests/e2e/test_e2e.py: the shipped matrix under a repository of this module's own in the
session's registry, and the 3.11 base replaced by a name of this module's own
(`torch-images-e2e-base:rebuild-…`), so it never touches the user's registry or base. That name
starts as a second tag of the bootstrapped `torch-images-base:bookworm-slim`, the session's
publication's base (fixtures_published, asked for first): the first build takes the steps its
build cached and `docker push` mounts the layers its staging holds instead of compressing them
again. Then the name is moved to a base with one more package, made FROM it, and everything after
it is built, smoked and pushed anew. Only the CPU runtime variant is built, and published without
zstd twins (`compression: [gzip]`: each twin is a recompression of the whole image, and this
module proves nothing about them).

PyPI's vulnerability data may be unreachable (pinned releases unknown to it): then python-vuln
is `unknown` (exit 2), never clean; the test checks that once and skips that source otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml
from helpers import private_matrix, remove_images_of, run_builder

from builder.core import engine, oci
from builder.core.oci import registry_url
from builder.model import bases
from builder.model.matrix import Base
from builder.stages import base

pytestmark = pytest.mark.docker

CPU = "2.13.0-py3.11-cpu-runtime"
FLOATING = "2.13.0-py3.11-cpu-runtime"
# Unique per run: concurrent runs (two checkouts, parallel CI jobs) must not move each other's base.
BASE_REF = f"torch-images-e2e-base:rebuild-{uuid.uuid4().hex[:8]}"
SOURCE_BASE = Base("mmdebstrap:bookworm")
NEW_PACKAGE = "less"  # not in the images (OS_PACKAGES_APT): the SBOM diff must list it
SKIP = ("--skip-source", "python-vuln")


def make_base(tmp: Path, name: str, dockerfile: str) -> str:
    """Build `dockerfile` as BASE_REF; returns the new image id."""
    context = tmp / name
    context.mkdir()
    (context / "Dockerfile").write_text(dockerfile)
    engine.docker("build", "--progress=plain", "-t", BASE_REF, str(context), timeout=1800)
    info = engine.inspect_image(BASE_REF)
    assert info is not None
    return info["Id"]


@pytest.fixture(scope="module")
def env(shared_publication, registry_addr, tmp_path_factory):
    """A repository of this module's own in the session's registry, a matrix whose 3.11 base is
    BASE_REF, and that base (a name of the bootstrap); all removed afterwards (pushed/built
    images, the moved base)."""
    tmp = tmp_path_factory.mktemp("rebuild-e2e")
    # no zstd twins: test_zstd_twins proves them, not this module
    matrix_path = private_matrix(tmp, registry=registry_addr, compression=["gzip"])
    data = yaml.safe_load(matrix_path.read_text())
    data["bases"]["3.11"] = {"image": BASE_REF, "python_from": "apt"}
    matrix_path.write_text(yaml.safe_dump(data, sort_keys=False))
    manifest = tmp / "published.json"
    base.ensure(SOURCE_BASE, progress=print)  # torch-images-base:bookworm-slim (bootstrap if absent)
    engine.docker("tag", bases.local_ref(SOURCE_BASE), BASE_REF)
    made: list[str] = []  # the moved base: never the bootstrap's id (BASE_REF is only a name)
    try:
        yield {"matrix": matrix_path, "addr": registry_addr, "tmp": tmp, "manifest": manifest,
               "repository": data["repository"], "made": made,
               "state": tmp / "state"}  # never the user's .state/ (#25)
    finally:
        remove_images_of(matrix_path)
        ids = []
        if manifest.exists():
            for entry in json.loads(manifest.read_text())["variants"].values():
                ids += [p["image_id"] for p in entry["publications"]]
        for ref in [*ids, BASE_REF, *made]:
            engine.remove_image(ref)


def builder(env, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run_builder(*args, matrix=env["matrix"], check=check,
                       env={**os.environ, "BUILDER_STATE": str(env["state"])})


def rebuild(env, *args: str) -> subprocess.CompletedProcess[str]:
    """`builder rebuild`; one that may publish does so unsigned (test_signing signs)."""
    unsigned = () if "--check" in args or "--dry-run" in args else ("--unsigned",)
    return builder(env, "rebuild", "--select", f"id={CPU}", "--manifest", str(env["manifest"]),
                   *args, *unsigned, check=False)


def check_json(env, *args: str) -> tuple[int, dict]:
    result = rebuild(env, "--check", "--json", *args)
    try:
        return result.returncode, json.loads(result.stdout)
    except ValueError:
        pytest.fail(f"rebuild --check printed no JSON (exit {result.returncode})\n"
                    f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}")


def registry_digest(env, tag: str) -> str | None:
    desc = oci.Registry(env["addr"]).head(env["repository"], tag)
    return desc.digest if desc else None


def registry_tags(env) -> list[str]:
    url = f"{registry_url(env['addr'])}/v2/{env['repository']}/tags/list"
    with urllib.request.urlopen(url, timeout=10) as response:
        return sorted(json.loads(response.read())["tags"])


def publications(env) -> list[dict]:
    return json.loads(env["manifest"].read_text())["variants"][CPU]["publications"]


@pytest.fixture(scope="module")
def published(env):
    builder(env, "build", "--select", f"id={CPU}")  # a repository of its own: never up to date
    builder(env, "publish", "--select", f"id={CPU}", "--manifest", str(env["manifest"]),
            "--unsigned")
    [pub] = publications(env)
    assert registry_digest(env, FLOATING) == pub["digest"]
    return pub


def test_unasked_python_vuln_is_unknown_never_clean(env, published):
    """Without the skip, pip-audit is really asked; here (no vulnerability data for pinned
    releases) that makes python-vuln `unknown` and the check exit 2. Where the data is
    reachable it must still not invent a rebuild for an unchanged image."""
    code, out = check_json(env)
    vuln = [f for f in out["findings"] if f["reason"] == "python-vuln"]
    assert out["skipped"] == []
    if out["sources"]["python-vuln"] == "unknown":
        assert code == 2 and out["exit_code"] == 2
        assert vuln and all(f["status"] == "unknown" for f in vuln)
    else:  # a machine that reaches PyPI's vulnerability data
        assert out["sources"]["python-vuln"] in ("clean", "rebuild", "matrix-change")
    assert out["sources"]["python-vuln"] != "skipped"


def test_nothing_changed_checks_clean_and_pushes_nothing(env, published):
    code, out = check_json(env, *SKIP)
    assert (code, out["findings"]) == (0, []), out
    assert out["skipped"] == ["python-vuln"]
    assert out["sources"] == {"debian-security": "clean", "python-vuln": "skipped",
                              "base-moved": "clean", "inputs-changed": "clean",
                              "tag-drift": "clean"}

    tags_before = registry_tags(env)
    result = rebuild(env, *SKIP)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "nothing rebuilt, nothing pushed" in result.stdout
    assert "skipped (not asked, so not known to be clean): python-vuln" in result.stdout
    assert registry_tags(env) == tags_before
    assert registry_digest(env, FLOATING) == published["digest"]
    assert len(publications(env)) == 1


def test_moved_base_is_rebuilt_and_republished(env, published):
    # The base is rebuilt under the same tag with one more package.
    env["made"].append(make_base(
        env["tmp"], "base-2",
        f"FROM {BASE_REF}\n"
        "RUN apt-get update \\\n"
        f" && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
        f"{NEW_PACKAGE} \\\n"
        " && rm -rf /var/lib/apt/lists/*\n"))

    code, out = check_json(env, *SKIP)
    assert code == 1 and out["exit_code"] == 1, out
    reasons = {(f["variant_id"], f["reason"], f["status"]) for f in out["findings"]}
    assert (CPU, "base-moved", "rebuild") in reasons
    # the content hash is compared on the published base: a moved base is not counted twice
    assert out["sources"]["inputs-changed"] == "clean"
    [moved] = [f for f in out["findings"] if f["reason"] == "base-moved"]
    assert moved["data"]["old"] != moved["data"]["new"]
    human = rebuild(env, "--check", *SKIP)
    assert human.returncode == 1 and "base-moved" in human.stdout

    tags_before = registry_tags(env)
    result = rebuild(env, *SKIP)
    log = result.stdout + result.stderr[-5000:]
    assert result.returncode == 0, log
    assert "published" in result.stdout, log

    old, new = publications(env)
    assert old == published
    assert new["digest"] != old["digest"] and new["image_id"] != old["image_id"]
    if new["date"] == old["date"]:  # same UTC day: the dated tag is never overwritten
        assert new["dated_tag"] == old["dated_tag"] + ".1"
    assert new["dated_tag"] not in tags_before and new["dated_tag"] in registry_tags(env)
    # the floating tag moved; the old dated tag still names the old image
    assert registry_digest(env, FLOATING) == new["digest"]
    assert registry_digest(env, new["dated_tag"]) == new["digest"]
    assert registry_digest(env, old["dated_tag"]) == old["digest"]
    sbom_tag = f"{new['digest'].replace(':', '-')}.sbom"
    assert registry_digest(env, sbom_tag) == new["sbom"]["digest"]

    # the SBOM diff old → new lists the package the base gained
    assert f"changes in {CPU}:" in result.stdout, log
    diff = result.stdout.split(f"changes in {CPU}:", 1)[1]
    print(human.stdout, result.stdout, sep="\n")  # shown with `pytest -rP`
    assert f"+ deb/{NEW_PACKAGE} " in diff, diff

    # the catalog, from the registry alone, shows both dated builds of the real image: the
    # second's changelog names the package the base gained, and why `rebuild` rebuilt it
    site = env["tmp"] / "site"
    run_builder("catalog", f"{env['addr']}/{env['repository']}", "--out", str(site))
    history = {v["tag"]: v for v in json.loads((site / "catalog.json").read_text())["variants"]}
    entries = history[FLOATING]["history"]
    assert [e["tag"] for e in entries] == [old["dated_tag"], new["dated_tag"]]
    assert entries[1]["reasons"] == ["base-moved"]
    assert NEW_PACKAGE in [c["name"] for c in entries[1]["changes"]["added"]]
    page = (site / "tags" / f"{new['dated_tag']}.html").read_text()
    assert f"+ deb/{NEW_PACKAGE} " in page and "base-moved" in page

    # the new image answers every source again
    code, out = check_json(env, *SKIP)
    assert (code, out["findings"]) == (0, []), out

