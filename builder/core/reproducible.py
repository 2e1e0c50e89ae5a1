"""Reproducible image configs: the same layers give the same image id on any engine.

Docker 20.10's BuildKit stamps the build's wall-clock time into the image config (`created` and
every `history[].created`) and ignores SOURCE_DATE_EPOCH, so two builds of identical layers get
two image ids and two manifest digests. Right after a build, `normalise_image` writes the config
again with those times set to the image's `org.opencontainers.image.created` label (the lock's
commit time; SOURCE_DATE_EPOCH without it) and loads it with `docker load` — a tar holding only
the config: the engine already has every layer, so nothing is copied. The image then has the
same id here, in the registry after `docker push`, and on any machine that rebuilds it, and the
provenance says so (`record`). The layers themselves are made reproducible by the templates
(templates/reproducible.j2). A base rootfs is loaded the same way (`load_rootfs`), so a
re-bootstrapped base with the same packages is the same image, and BuildKit's cache keys, which
start from the base's id, stay the same.

Written by hand: no library writes a Docker config for an image that is already in the engine.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from builder.core import engine, labels
from builder.core.errors import BuilderError

SOURCE_DATE_EPOCH = labels.SOURCE_DATE_EPOCH  # the layers' fixed file time
METHOD = ("config and history `created` set to the image's org.opencontainers.image.created "
          "label (the lock's commit time) and the config loaded again with `docker load`; layer "
          f"file times clamped to SOURCE_DATE_EPOCH={SOURCE_DATE_EPOCH} by the templates")
# Instructions that always make a layer (BuildKit marks the others `empty_layer`).
_LAYER_INSTRUCTIONS = ("RUN ", "COPY ", "ADD ", "WORKDIR ")
_CONFIG_KEYS = ("User", "ExposedPorts", "Env", "Entrypoint", "Cmd", "Volumes", "WorkingDir",
                "Labels", "StopSignal", "Healthcheck", "Shell", "ArgsEscaped", "OnBuild")


def epoch_time(epoch: int = SOURCE_DATE_EPOCH) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def created_of(image_labels: dict[str, str]) -> str:
    """The one time a normalised config carries."""
    return image_labels.get(labels.OCI + "created") or epoch_time()


def config_bytes(config: dict[str, Any]) -> bytes:
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def image_id(config: dict[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(config_bytes(config)).hexdigest()


def _history(ref: str, diff_ids: list[str]) -> list[dict[str, Any]]:
    """The image's history, oldest first, each entry marked empty or not. `docker history`
    hides `empty_layer`: an entry with bytes, one of the layer-making instructions or a
    non-BuildKit entry (the base) made a layer; the count must match the layers."""
    out = engine.docker("history", "--human=false", "--no-trunc", "--format", "{{json .}}", ref)
    entries = []
    for line in reversed(out.stdout.splitlines()):
        item = json.loads(line)
        by, comment = item.get("CreatedBy") or "", item.get("Comment") or ""
        makes_layer = (int(item.get("Size") or 0) > 0 or by.startswith(_LAYER_INSTRUCTIONS)
                       or not comment.startswith("buildkit"))
        entries.append({"created_by": by, "comment": comment, "empty_layer": not makes_layer})
    if sum(not e["empty_layer"] for e in entries) != len(diff_ids):
        raise BuilderError(f"cannot tell the layers in the history of {ref}",
                           hint="its history and its layers disagree: rebuild it")
    return entries


def normalised_config(info: dict[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
    """The config of an inspected image with every time fixed (a pure function)."""
    config = {k: v for k, v in (info.get("Config") or {}).items() if k in _CONFIG_KEYS and v}
    created = created_of(config.get("Labels") or {})
    doc: dict[str, Any] = {
        "architecture": info["Architecture"], "os": info["Os"], "config": config,
        "created": created,
        "history": [{"created": created, **{k: v for k, v in h.items() if v}} for h in history],
        "rootfs": {"type": "layers", "diff_ids": info["RootFS"]["Layers"]},
    }
    if info.get("Variant"):
        doc["variant"] = info["Variant"]
    return doc


def normalise_image(image: str, ref: str, keep: str | None = None) -> str:
    """Give the built image `image` its normalised config, under the tag `ref`; returns the new
    image id. The original stays as `keep` when given (its config holds BuildKit's inline
    cache, which `--cache-from` reads), else it is removed."""
    info = engine.inspect_image(image)
    if info is None:
        raise BuilderError(f"no image {image} in the engine")
    config = normalised_config(info, _history(image, info["RootFS"]["Layers"]))
    new_id = load_config(config, ref)
    if keep:
        engine.docker("tag", info["Id"], keep)
    elif new_id != info["Id"]:
        engine.docker("image", "rm", info["Id"], check=False)
    return new_id


def load_config(config: dict[str, Any], ref: str, layer_tar: Path | None = None) -> str:
    """`docker load` of `config` tagged `ref`. Without `layer_tar` every layer must already be
    in the engine (the archive names them but holds none); with it, that one-layer rootfs."""
    data = config_bytes(config)
    digest = hashlib.sha256(data).hexdigest()
    diff_ids = config["rootfs"]["diff_ids"]
    layers = [f"{d.removeprefix('sha256:')}/layer.tar" for d in diff_ids]
    manifest = json.dumps([{"Config": f"{digest}.json", "RepoTags": [ref], "Layers": layers}])
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "image.tar"
        with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
            _add(tar, f"{digest}.json", data)
            _add(tar, "manifest.json", manifest.encode())
            if layer_tar is not None:
                tar.add(layer_tar, arcname=layers[0])
        engine.docker("load", "-q", "-i", str(archive), timeout=1800)
    return f"sha256:{digest}"


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = SOURCE_DATE_EPOCH
    tar.addfile(info, io.BytesIO(data))


def rootfs_config(diff_id: str, created_by: str, cmd: list[str]) -> dict[str, Any]:
    """The config of a one-layer base image made from a rootfs tarball (fixed time)."""
    return {
        "architecture": "amd64", "os": "linux", "config": {"Cmd": cmd},
        "created": epoch_time(),
        "history": [{"created": epoch_time(), "created_by": created_by}],
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }


def load_rootfs(tar: Path, ref: str, created_by: str, cmd: list[str]) -> str:
    """Load a rootfs tarball as a one-layer image with a fixed config; returns its id. Its diff
    id is the tarball's digest, so the same bytes give the same image on every engine."""
    config = rootfs_config(file_digest(tar), created_by, cmd)
    return load_config(config, ref, layer_tar=tar)


def file_digest(path: Path) -> str:
    """`sha256:<hex>` of a file, read in chunks (a rootfs tarball's diff id)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def record(config: dict[str, Any]) -> dict[str, Any] | None:
    """What the provenance says about the normalisation of an image with this config (read
    from the registry): None when its times are not the normalised ones."""
    created = created_of((config.get("config") or {}).get("Labels") or {})
    times = {config.get("created")} | {h.get("created") for h in config.get("history") or []}
    if times != {created}:
        return None
    return {"normalised": True, "created": created, "method": METHOD,
            "source_date_epoch": SOURCE_DATE_EPOCH}
