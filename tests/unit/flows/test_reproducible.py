"""Reproducible images: every layer-making step settles its file times, the config's times come
from the lock, and `reproduce` reads the provenance and names the files that differ."""

from __future__ import annotations

import io
import json
import re
import tarfile

from rendering import rendered

from builder.core import labels, layerdiff, reproducible
from builder.flows import reproduce
from builder.stages import base, provenance, render


def runs(dockerfile: str) -> list[str]:
    """The RUN instructions of the image stages (continuations joined); the uv stage is a
    tool stage that no image holds."""
    text = re.sub(r"\\\n", " ", dockerfile)
    out, stage = [], ""
    for line in text.splitlines():
        if line.startswith("FROM "):
            stage = line.split()[-1]
        elif line.startswith("RUN ") and stage != "uv":
            out.append(line)
    return out


def test_every_step_dates_what_it_makes_and_empties_its_logs(shipped):
    for v in shipped.variants:
        text = rendered(shipped, v.id).dockerfile
        steps = runs(text)
        assert steps, v.id
        for run in steps:
            assert 'stamp="$(mktemp' in run and '-newer "$stamp"' in run, (v.id, run[:120])
            assert f"touch -h -d @{render.FIXED_EPOCH}" in run, (v.id, run[:120])
        for run in steps:
            if "apt-get" in run:  # root steps that run dpkg empty their logs and the aux-cache
                assert "/var/log /var/cache/ldconfig" in run and "truncate -s 0" in run
        # files reach the image only through RUN (modes and times from the step, not the
        # checkout); the CUDA 12 toolkit's COPY --from is a stage of its own
        copies = [line for line in text.splitlines() if line.startswith(("COPY", "ADD"))]
        assert all("--from=toolkit" in line for line in copies), (v.id, copies)


def test_the_layer_time_is_fixed_not_the_locks(shipped):
    """A new lock must not re-date the layers it does not change (a numpy bump keeps torch's)."""
    a = rendered(shipped, "2.13.0-py3.11-cpu-runtime").dockerfile
    b = rendered(shipped, "2.13.0-py3.11-cpu-slim").dockerfile
    assert re.findall(r"touch -h -d @(\d+)", a) and \
        set(re.findall(r"touch -h -d @(\d+)", a)) == set(re.findall(r"touch -h -d @(\d+)", b)) \
        == {str(render.FIXED_EPOCH)}


INFO = {
    "Id": "sha256:" + "1" * 64, "Architecture": "amd64", "Os": "linux",
    "Config": {"User": "1000:1000", "Env": ["A=1"], "Cmd": ["python"], "Hostname": "",
               "Labels": {labels.OCI + "created": "2026-12-02T17:16:42Z", "x": "y"},
               "Volumes": None, "ArgsEscaped": True},
    "RootFS": {"Layers": ["sha256:" + "a" * 64, "sha256:" + "b" * 64]},
}
HISTORY = [{"created_by": "", "comment": "Imported", "empty_layer": False},
           {"created_by": "ENV A=1", "comment": "buildkit.dockerfile.v0", "empty_layer": True},
           {"created_by": "RUN x", "comment": "buildkit.dockerfile.v0", "empty_layer": False}]


def test_the_normalised_config_is_a_function_of_the_image_with_the_locks_time():
    config = reproducible.normalised_config(INFO, HISTORY)
    assert config == reproducible.normalised_config(INFO, HISTORY)
    assert config["created"] == "2026-12-02T17:16:42Z"
    assert {h["created"] for h in config["history"]} == {"2026-12-02T17:16:42Z"}
    assert [h.get("empty_layer", False) for h in config["history"]] == [False, True, False]
    assert "Hostname" not in config["config"] and "Volumes" not in config["config"]
    assert config["rootfs"]["diff_ids"] == INFO["RootFS"]["Layers"]
    assert reproducible.image_id(config).startswith("sha256:")
    record = reproducible.record(config)
    assert record and record["normalised"] and record["created"] == config["created"]
    raw = {**config, "history": [{**h, "created": "2026-12-04T07:17:10.9Z"}
                                 for h in config["history"]]}
    assert reproducible.record(raw) is None  # BuildKit's own wall-clock times


def test_without_a_created_label_the_config_carries_source_date_epoch():
    info = {**INFO, "Config": {"Cmd": ["bash"]}}
    config = reproducible.normalised_config(info, HISTORY)
    assert config["created"] == "2024-01-01T00:00:00Z" == reproducible.epoch_time()


def _layer(files: dict[str, tuple[bytes, int]]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (data, mtime) in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), mtime
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def test_differing_paths_name_the_file_and_what_differs():
    a = layerdiff.listing(_layer({"opt/a": (b"x", 1), "opt/built-at": (b"07:00", 1),
                                  "opt/gone": (b"", 1)}))
    b = layerdiff.listing(_layer({"opt/a": (b"x", 1), "opt/built-at": (b"07:05", 9),
                                  "opt/new": (b"", 1)}))
    assert layerdiff.differing_paths(a, b) == [
        "/opt/built-at (mtime, content)", "/opt/gone (only in the published)",
        "/opt/new (only in the rebuild)"]
    assert layerdiff.differing_paths(a, a) == []


def test_reproduce_reads_commit_lock_and_base_from_the_provenance():
    image_labels = {labels.OCI + "revision": "c0ffee" * 6 + "abcd",
                    labels.OCI + "base.digest": "sha256:" + "e" * 64,
                    labels.OCI + "base.name": "mmdebstrap:bookworm",
                    labels.VARIANT: "2.13.0-py3.11-cpu-runtime", labels.LOCK_HASH: "f" * 64}
    doc = provenance.statement("r/torch", "sha256:" + "0" * 64, image_labels,
                               {"normalised": True})
    rec = reproduce.recorded(doc)
    assert rec == reproduce.Recorded(variant="2.13.0-py3.11-cpu-runtime", revision="c0ffee" * 6 + "abcd",
                                     lock_path="locks/2.13.0-py3.11-cpu-runtime.txt", lock_sha256="f" * 64,
                                     base_name="mmdebstrap:bookworm", base_digest="sha256:" + "e" * 64)
    internal = doc["predicate"]["buildDefinition"]["internalParameters"]
    assert internal["reproducible"] == {"normalised": True}
    assert base.registry_tag(rec.base_digest) == "layers-" + "e" * 32


class _Manifests:
    """Just enough of a registry for `layerdiff.delta`: manifests by digest."""

    registry = "fake"

    def __init__(self, docs: dict[str, dict]) -> None:
        self.docs = docs

    def manifest(self, repository: str, ref: str):
        doc = self.docs.get(ref)
        return None if doc is None else (json.dumps(doc).encode(), None)


def _image(config: str, *layers: tuple[str, int]) -> dict:
    return {"config": {"digest": config, "size": 1_000},
            "layers": [{"digest": d, "size": s} for d, s in layers]}


def test_a_one_package_rebuild_costs_a_node_the_new_blobs_only():
    base, torch, numpy_old, numpy_new = ("sha256:b", 80_000_000), ("sha256:t", 600_000_000), \
        ("sha256:n1", 20_000_000), ("sha256:n2", 21_000_000)
    reg = _Manifests({"old": _image("sha256:c1", base, torch, numpy_old),
                      "new": _image("sha256:c2", base, torch, numpy_new),
                      "index": {"manifests": [{"digest": "new"}]}})
    assert layerdiff.delta(reg, "torch", "old", "new") == (21_001_000, 701_001_000)
    assert layerdiff.delta(reg, "torch", "old", "index") == (21_001_000, 701_001_000)
    assert layerdiff.delta(reg, "torch", "new", "new") == (0, 701_001_000)
