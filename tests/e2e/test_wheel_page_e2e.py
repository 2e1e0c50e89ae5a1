"""A CPU variant as a hosted runner builds it: no wheel folder on the machine (no
$BUILDER_WHEEL_MIRROR, no $PIP_FIND_LINKS), torch taken from the page its `find_links` names.
The page is the PyTorch CPU index's layout (`%2B`-quoted names, `#sha256=` fragments), served
over HTTP from this machine with the genuine wheel (taken as any build here takes it: from the
mirror where one is set, else from download.pytorch.org). `builder lock` resolves against the
page and `builder build` installs from it, checked by the lock's hash.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, private_matrix, run_builder

from builder.model import matrix
from builder.model.lockfile import parse_pins
from builder.stages.render import split_requirements
from builder.stages.wheelhouse import Wheelhouse

pytestmark = pytest.mark.docker

CPU = "2.13.0-py3.11-cpu-runtime"


SEEN: list[str] = []  # the paths the page's server was asked for


class Logged(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        SEEN.append(self.path)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(the page's URL, the served wheel's sha256)."""
    served = tmp_path_factory.mktemp("wheel-page")
    variant = matrix.load(ROOT / "matrix.yaml").variant(CPU)
    torch = next(block for name, block in split_requirements(
        (ROOT / "locks" / f"{CPU}.txt").read_text()) if name == "torch")
    [wheel] = Wheelhouse(served / "house").source_wheels(variant, variant.find_links, torch)
    (served / "torch").mkdir()
    shutil.copy(wheel, served / "torch" / wheel.name)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    quoted = wheel.name.replace("+", "%2B")
    (served / "torch" / "index.html").write_text(
        f'<html><body><a href="{quoted}#sha256={sha}">{wheel.name}</a><br/></body></html>\n')
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(Logged, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/torch/", sha
    server.shutdown()


def test_a_runner_without_a_wheel_folder_locks_and_builds_from_the_page(
        page: tuple[str, str], tmp_path: Path) -> None:
    url, sha = page
    matrix_path = private_matrix(tmp_path)
    data = yaml.safe_load(matrix_path.read_text())
    for entry in data["include"]:
        if entry.get("find_links"):
            entry["find_links"] = [url]
    matrix_path.write_text(yaml.safe_dump(data, sort_keys=False))
    locks = tmp_path / "locks"
    shutil.copytree(ROOT / "locks", locks)
    env = {k: v for k, v in os.environ.items()
           if k not in ("BUILDER_WHEEL_MIRROR", "PIP_FIND_LINKS")}
    env["BUILDER_STATE"] = str(tmp_path / "state")  # an empty wheelhouse, as on a fresh runner
    select = ("--select", f"id={CPU}", "--locks", str(locks))

    run_builder("lock", *select, matrix=matrix_path, env=env)
    text = (locks / f"{CPU}.txt").read_text()
    assert f"--find-links {url}\n" in text and "/opt/wheels" not in text
    assert f"--hash=sha256:{sha}" in text.split("torch==", 1)[1].split("\n\n")[0]
    assert parse_pins(text)["torch"] == "2.13.0+cpu"

    SEEN.clear()
    out = run_builder("build", *select, "--no-smoke", "--no-sbom", "--json",
                      matrix=matrix_path, env=env)
    [outcome] = json.loads(out.stdout)
    assert outcome["state"] == "built", outcome
    assert any(p.startswith("/torch/torch-2.13.0") for p in SEEN), SEEN
