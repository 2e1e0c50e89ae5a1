"""A run that crosses midnight UTC, for real (issue 44): the CPU runtime built and staged with
signed evidence at 23:59:59 (`TORCH_IMAGES_NOW`), then on the next day, with the same state
folder, `plan` finds the same content hash, `build` says up to date and a dry-run `publish`
would publish it; and a fresh runner (another state folder, no base in the engine) publishes
the staged image on that next day without building, under the publish day's dated tag, and
`verify --key` is ok. One build: nothing is built after 23:59:59.

That build is the session's CPU runtime (fixtures_published) again, under its key, into a
registry of this module's own: the build cache's layers, the same image id, so the runner's state
folder (fixtures_published.evidence_state) has its smoke report and SBOM (evidence by image id,
not what this module proves). Its staging is a repository of this module's own in the session's
registry (`own_staging`: the push mounts the session's layers); the staging and everything after
it are this module's own, and it publishes no zstd twins (`compression: [gzip]`).

The base's names are held aside for the fresh runner and put back (helpers.base_removed).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from fixtures_published import (
    Publication,
    evidence_state,
    moved_matrix,
    own_registry,
    own_staging,
)
from helpers import base_removed, run_builder

from builder.core import clock, engine
from builder.model.bases import bootstrap_ref

pytestmark = pytest.mark.docker

CPU = "2.13.0-py3.11-cpu-runtime"
# The build day ends at 23:59:59; the next day is the session's day by the one clock (dates after
# today are not publications; under `--clock-start` it is the ticking clock's), so the build day
# is the day before.
NEXT_DAY = clock.start().date()
BUILD_DAY = NEXT_DAY - dt.timedelta(days=1)


@pytest.fixture(scope="module")
def env(shared_publication: Publication, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[dict[str, Any]]:
    """The session's matrix moved to a registry of this module's own (its staging a repository
    of its own in the session's registry), its key, and the runner's state folder `ci` (the
    session's evidence); its images removed afterwards."""
    tmp = tmp_path_factory.mktemp("midnight")
    shared = shared_publication
    evidence_state(shared, tmp / "ci")
    environ = dict(shared.env)
    environ.pop(clock.ENV, None)
    with own_registry(tmp) as addr, own_staging(shared, "midnight") as staging:
        # no zstd twins: each is a recompression of the image, and test_zstd_twins proves them
        matrix = moved_matrix(shared, tmp, addr, compression=["gzip"], staging=staging)
        yield {"matrix": matrix, "addr": addr, "tmp": tmp,
               "env": environ, "key": shared.key, "pub": shared.pub,
               "repo": shared.repository, "image_id": shared.built["image_id"]}


def at(env: dict[str, Any], when: str, state: str, *args: str, check: bool = True
       ) -> subprocess.CompletedProcess[str]:
    """`builder ARGS` with the clock at `when` and BUILDER_STATE `state` (under the module's
    temporary folder)."""
    environ = {**env["env"], clock.ENV: when, "BUILDER_STATE": str(env["tmp"] / state)}
    return run_builder(*args, matrix=env["matrix"], env=environ, check=check)


def before_midnight(env: dict[str, Any], state: str, *args: str) -> Any:
    return json.loads(at(env, f"{BUILD_DAY.isoformat()}T23:59:59Z", state, *args).stdout)


def next_day(env: dict[str, Any], state: str, *args: str) -> Any:
    return json.loads(at(env, f"{NEXT_DAY.isoformat()}T00:00:30Z", state, *args).stdout)


@pytest.fixture(scope="module")
def staged(env: dict[str, Any]) -> dict[str, Any]:
    """Built, smoked, described and staged with signed evidence at 23:59:59 (state `ci`)."""
    [outcome] = before_midnight(env, "ci", "build", "--select", f"id={CPU}", "--stage",
                                "--key", str(env["key"]), "--json")
    assert outcome["state"] == "built", outcome
    assert outcome["image_id"] == env["image_id"], outcome  # the session's image, rebuilt
    [planned] = before_midnight(env, "ci", "plan", "--select", f"id={CPU}", "--json")["include"]
    return {"ref": outcome["message"], "digest": outcome["message"].rsplit("@", 1)[1],
            "plan": planned}


def test_the_next_day_the_same_runner_finds_it_up_to_date_and_publishable(env, staged) -> None:
    [planned] = next_day(env, "ci", "plan", "--select", f"id={CPU}", "--json")["include"]
    assert (planned["base_digest"], planned["content_hash"]) == (
        staged["plan"]["base_digest"], staged["plan"]["content_hash"])
    [outcome] = next_day(env, "ci", "build", "--select", f"id={CPU}", "--json")
    assert outcome["state"] == "up-to-date", outcome
    [would] = next_day(env, "ci", "publish", "--select", f"id={CPU}", "--dry-run", "--json",
                       "--key", str(env["key"]))
    assert would["status"] == "would-publish", would
    assert would["staged"] == staged["ref"]
    assert would["tags"][0].endswith(f"-{NEXT_DAY:%Y%m%d}[.n]")  # the publish day's


def test_a_fresh_runner_publishes_it_the_next_day_without_building(env, staged) -> None:
    """build.yml's publish job on another runner after midnight: no base in its engine, an
    empty state folder; the staged image's base is the signed base of the build day."""
    with base_removed():
        assert engine.inspect_image(bootstrap_ref("bookworm")) is None
        result = at(env, f"{NEXT_DAY.isoformat()}T00:00:30Z", "fresh", "publish", "--select",
                    f"id={CPU}", "--json", "--key", str(env["key"]),
                    "--manifest", str(env["tmp"] / "published.json"))
        assert engine.inspect_image(bootstrap_ref("bookworm")) is None  # nothing bootstrapped
    [published] = json.loads(result.stdout)
    assert published["status"] == "published", published
    assert published["digest"] == staged["digest"]  # the staged image itself: not rebuilt
    dated = f"{CPU}-{NEXT_DAY:%Y%m%d}"
    assert dated in published["tags"], published
    verified = run_builder("verify", f"{env['addr']}/{env['repo']}:{dated}", "--key",
                           str(env["pub"]), env=env["env"], check=False)
    assert verified.returncode == 0, verified.stdout + verified.stderr
