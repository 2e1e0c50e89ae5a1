"""builder.flows.bases with an in-memory registry and a fake engine: which way a bootstrapped
base arrives (taken from the registry, verified / bootstrapped, saying why) and when it is kept
signed in the registry; a foreign-platform (arm64) bootstrap, served from the registry, used only
when it verifies and its floating tag pointed back at it. No engine, no mmdebstrap: those are the e2e test's
(tests/e2e/test_signed_base_e2e.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from matrix_files import ROOT
from memregistry import MemoryRegistry

from builder.core import keypair, oci, reproducible, rootfs_image
from builder.core.keypair import NOBODY, Vouchers
from builder.flows import bases
from builder.flows.build import BuildOptions  # at collection: core/swap runs ldconfig on import
from builder.model import matrix, platforms
from builder.model.bases import bootstrap_ref
from builder.stages import base, signed_base

KEY = "0123456789abcdef"
REF = bootstrap_ref("bookworm")


def new_key() -> keypair.SigningKey:
    return keypair.SigningKey(ec.generate_private_key(ec.SECP256R1()))


class Runner:
    """One machine's engine, faked at builder.stages.base's seams: images by ref, the rootfs
    tarballs it holds, and whether mmdebstrap ran."""

    def __init__(self, tmp: Path, created_by: str = "mmdebstrap --variant=minbase bookworm"):
        self.tmp, self.created_by = tmp, created_by
        self.images: dict[str, dict[str, Any]] = {}
        self.tars: dict[str, Path] = {}
        self.ran: list[str] = []
        tmp.mkdir(parents=True, exist_ok=True)

    def config(self, tar: Path) -> dict[str, Any]:
        return reproducible.rootfs_config(reproducible.file_digest(tar), self.created_by, ["bash"])

    def load(self, suite: str, tar: Path, slim: bool = True) -> str:
        config = self.config(tar)
        kept = self.tmp / f"{len(self.tars)}.tar"
        kept.write_bytes(tar.read_bytes())
        image_id = reproducible.image_id(config)
        self.images[REF] = {"Id": image_id, "RootFS": {"Layers": config["rootfs"]["diff_ids"]}}
        self.tars[image_id] = kept
        return image_id

    def ensure_variant(self, _m: Any, _v: Any, progress: Any) -> str:
        if REF not in self.images:
            self.ran.append("mmdebstrap")
            tar = self.tmp / "bootstrapped.tar"
            tar.write_bytes(b"the same packages today" * 1000)
            self.load("bookworm", tar)
        return base.digest_of(self.images[REF])

    def export(self, suite: str, folder: Path) -> tuple[bytes, Path]:
        info = self.images[REF]
        return reproducible.config_bytes(self.config(self.tars[info["Id"]])), \
            self.tars[info["Id"]]

    def docker(self, *args: str, **_kw: Any) -> None:
        self.ran.append(" ".join(args))
        self.images.pop(args[-1], None)


@pytest.fixture
def world(monkeypatch, tmp_path):
    """(registry, make_runner): each runner patched in when made; the registry is shared."""
    reg = MemoryRegistry()
    monkeypatch.setattr(oci, "Registry", lambda _addr: reg)
    monkeypatch.setattr(base, "bootstrap_key", lambda suite, day=None, options=(): KEY)
    monkeypatch.setattr(base, "mmdebstrap_inputs", lambda suite, arch=None, key=None: {
        "suite": suite, "bootstrap_key": key or KEY, "mmdebstrap": "1.3.5",
        **({"arch": arch} if arch else {})})

    def runner(name: str, **kw: Any) -> Runner:
        r = Runner(tmp_path / name, **kw)
        monkeypatch.setattr(base, "have_bootstrapped", lambda suite, slim=True: REF in r.images)
        monkeypatch.setattr(base, "load_bootstrapped", r.load)
        monkeypatch.setattr(base, "ensure_variant", r.ensure_variant)
        monkeypatch.setattr(base, "export_bootstrapped", r.export)
        monkeypatch.setattr(bases.engine, "inspect_image", lambda ref: r.images.get(ref))
        monkeypatch.setattr(bases.engine, "docker", r.docker)
        return r
    return reg, runner


@pytest.fixture
def cpu():
    m = matrix.load(ROOT / "matrix.yaml")
    [v] = m.select(["id=2.13.0-py3.11-cpu-runtime", "platform=linux/amd64"])
    assert v.base.bootstrap_suite == "bookworm"
    return m, v


def lines(capsys) -> list[str]:
    return capsys.readouterr().err.splitlines()


def stage_with(world, cpu, key: keypair.SigningKey, capsys) -> str:
    """Runner 1 bootstraps and stages with `key`: returns its base digest."""
    _, runner = world
    first = runner("first")
    digest = bases.ensure(*cpu, bases.BaseOptions(Vouchers((key.public,)), key))
    assert first.ran == ["mmdebstrap"]
    [*_, pushed] = lines(capsys)
    assert pushed.startswith(f"base {REF}: pushed as `127.0.0.1:5000/torch-base:bookworm-{KEY}`")
    assert pushed.endswith(f"signed and attested by key {keypair.key_id(key.public)}")
    return digest


def test_a_fresh_runner_takes_the_signed_base_and_gets_the_same_digest(world, cpu, capsys):
    key = new_key()
    digest = stage_with(world, cpu, key, capsys)
    _, runner = world
    fresh = runner("fresh")
    assert bases.ensure(*cpu, bases.BaseOptions(Vouchers((key.public,)))) == digest
    assert fresh.ran == []  # no mmdebstrap
    [line] = lines(capsys)
    assert line.startswith(f"base {REF}: taken from `127.0.0.1:5000/torch-base:bookworm-{KEY}`")
    assert line.endswith(f"its signature and provenance verified against the trusted key "
                         f"{keypair.key_id(key.public)}")


def test_a_base_signed_by_another_key_is_bootstrapped_saying_why(world, cpu, capsys):
    digest = stage_with(world, cpu, new_key(), capsys)
    _, runner = world
    fresh = runner("fresh")
    assert bases.ensure(*cpu, bases.BaseOptions(Vouchers((new_key().public,)))) == digest
    assert fresh.ran == ["mmdebstrap"]
    assert lines(capsys) == [
        f"base {REF}: bootstrapping: the signature of `127.0.0.1:5000/torch-base:bookworm-{KEY}` "
        "did not verify: no valid signature: a signature by another key"]


@pytest.mark.parametrize(("options", "why"), [
    (bases.BaseOptions(), bases.NO_KEY),
    (bases.BaseOptions(Vouchers((new_key().public,)), from_registry=False), "--no-registry-cache"),
])
def test_without_a_trusted_key_or_with_no_registry_cache_the_registry_is_not_asked(
        world, cpu, capsys, monkeypatch, options, why):
    _, runner = world
    fresh = runner("fresh")
    monkeypatch.setattr(oci, "Registry", lambda _addr: pytest.fail("the registry was asked"))
    bases.ensure(*cpu, options)
    assert fresh.ran == ["mmdebstrap"]
    assert lines(capsys) == [f"base {REF}: bootstrapping: {why}"]


def test_an_absent_base_is_bootstrapped_saying_so(world, cpu, capsys):
    _, runner = world
    fresh = runner("fresh")
    bases.ensure(*cpu, bases.BaseOptions(Vouchers((new_key().public,))))
    assert fresh.ran == ["mmdebstrap"]
    assert lines(capsys) == [f"base {REF}: bootstrapping: "
                             f"`127.0.0.1:5000/torch-base:bookworm-{KEY}` is absent"]


def test_a_base_that_loads_to_another_image_id_is_removed_and_bootstrapped(world, cpu, capsys):
    key = new_key()
    stage_with(world, cpu, key, capsys)
    _, runner = world
    other = runner("other", created_by="another builder's history")  # another config, same tar
    bases.ensure(*cpu, bases.BaseOptions(Vouchers((key.public,))))
    assert other.ran == [f"image rm {REF}-{KEY}", f"image rm {REF}", "mmdebstrap"]
    [line] = lines(capsys)
    assert line.startswith(f"base {REF}: bootstrapping: `127.0.0.1:5000/torch-base:bookworm-"
                           f"{KEY}` loaded as image sha256:")
    assert "its provenance states" in line


def test_a_base_already_kept_and_verified_is_not_pushed_again(world, cpu, capsys, monkeypatch):
    key = new_key()
    stage_with(world, cpu, key, capsys)
    reg, _ = world
    before = dict(reg.manifests)
    monkeypatch.setattr(base, "export_bootstrapped", lambda *a: pytest.fail("exported again"))
    bases.ensure(*cpu, bases.BaseOptions(Vouchers((key.public,)), key))
    assert reg.manifests == before and lines(capsys) == []


def test_a_base_kept_by_another_key_is_pushed_and_signed_with_ours(world, cpu, capsys):
    stage_with(world, cpu, new_key(), capsys)
    mine = new_key()
    bases.ensure(*cpu, bases.BaseOptions(Vouchers((mine.public,)), mine))
    reg, _ = world
    at = signed_base.where(cpu[0], "bookworm", KEY)
    assert signed_base.verify(reg, at, Vouchers((mine.public,)), "bookworm")


def test_a_build_lends_its_bases_its_trust_and_signs_only_when_staging() -> None:
    key, other = new_key(), new_key()
    assert BuildOptions(key=key).base_options() == bases.BaseOptions(Vouchers((key.public,)), None, True)
    assert BuildOptions(key=key, stage=True, trusted=Vouchers((other.public,)),
                        registry_cache=False).base_options() == bases.BaseOptions(
        Vouchers((other.public,)), key, False)
    assert BuildOptions().base_options() == bases.BaseOptions()


def test_a_fresh_runner_that_publishes_knows_the_base_digest_from_the_signed_base(
        world, cpu, capsys, monkeypatch):
    """Publish (and plan) on a runner without the base: the staged content hash needs the base
    digest, read from the signed base's provenance, never bootstrapped, never by tag alone."""
    key = new_key()
    digest = stage_with(world, cpu, key, capsys)
    _, runner = world
    fresh = runner("fresh")
    monkeypatch.setattr(base, "known_digests", lambda _v, _m=None: {})  # nothing in this engine
    m, v = cpu
    key_of = base.platforms.base_key(v.base.image, v.platform)
    assert bases.known_digests(m, [v], Vouchers((key.public,))) == {key_of: digest}
    assert bases.known_digests(m, [v], Vouchers((new_key().public,))) == {}  # another key: unknown
    assert bases.known_digests(m, [v], NOBODY) == {}  # no trusted key: not asked
    assert fresh.ran == []


# ---- foreign-platform (arm64) bootstraps, served from the registry ---------------------------

ARM_REF = "127.0.0.1:5000/torch-base:bookworm-slim-arm64"
ARM_KEYED = f"{ARM_REF}-{KEY}"
ARM = platforms.get("linux/arm64")


@pytest.fixture
def arm(monkeypatch, tmp_path):
    """(matrix, the arm64 CUDA slim, the bootstraps run): mmdebstrap --arch=arm64 faked; what
    it makes is `content` (change it: Debian moved on)."""
    m = matrix.load(ROOT / "matrix.yaml")
    [v] = m.select(["id=2.15.0-py3.11-cuda-slim", "platform=linux/arm64"])
    ran: list[str] = []
    content = [b"the arm64 packages today"]

    def bootstrap(suite, platform, key, folder, progress):
        ran.append(f"mmdebstrap --arch={platform.arch} {suite}")
        tar = folder / "base.tar"
        tar.write_bytes(content[0] * 1000)
        return base.foreign_config(suite, platform, tar, key), tar
    monkeypatch.setattr(base, "bootstrap_foreign", bootstrap)
    monkeypatch.setattr(base.engine, "ensure_engine", lambda: None)
    return m, v, ran, content


def tag_digest(reg: MemoryRegistry, tag: str) -> str | None:
    found = reg.head("torch-base", tag)
    return found.digest if found else None


def plant(reg: MemoryRegistry, tmp_path: Path, tag: str) -> str:
    """An attacker with push rights: another arm64 rootfs under `tag`, unsigned."""
    tar = tmp_path / "planted.tar"
    tar.write_bytes(b"a backdoored rootfs" * 1000)
    return rootfs_image.push(reg, "torch-base", tar,  # type: ignore[arg-type]
                             base.foreign_config("bookworm", ARM, tar, KEY), [tag])


def made(m, v, options) -> bases.Bases:
    return bases.ensure_all(m, [v], options)


def test_a_signed_foreign_base_is_taken_by_digest_whatever_the_floating_tag_says(
        world, arm, capsys, tmp_path):
    reg, _ = world
    m, v, ran, _ = arm
    key = new_key()
    first = made(m, v, bases.BaseOptions(Vouchers((key.public,)), key))
    assert ran == ["mmdebstrap --arch=arm64 bookworm"]
    signed = tag_digest(reg, f"bookworm-slim-arm64-{KEY}")
    assert tag_digest(reg, "bookworm-slim-arm64") == signed
    assert lines(capsys)[-1] == (f"base {ARM_KEYED}: pushed ({signed[:19]}), signed and "  # type: ignore[index]
                                 f"attested by key {keypair.key_id(key.public)}")
    plant(reg, tmp_path, "bookworm-slim-arm64")  # the tag the Dockerfile's default names
    again = made(m, v, bases.BaseOptions(Vouchers((key.public,))))
    assert ran == ["mmdebstrap --arch=arm64 bookworm"]  # not bootstrapped again
    assert again == first
    [pin] = again.pins.values()
    assert pin == f"127.0.0.1:5000/torch-base@{signed}"
    assert lines(capsys) == [f"base {ARM_KEYED}: taken ({signed[:19]}), its signature and "  # type: ignore[index]
                             f"provenance verified against the trusted key "
                             f"{keypair.key_id(key.public)}"]


def test_an_unsigned_base_under_the_keyed_tag_is_bootstrapped_and_pinned_to_ours(
        world, arm, capsys, tmp_path):
    reg, _ = world
    m, v, ran, _ = arm
    planted = plant(reg, tmp_path, f"bookworm-slim-arm64-{KEY}")
    key = new_key()
    bases_made = made(m, v, bases.BaseOptions(Vouchers((key.public,)), key))
    assert ran == ["mmdebstrap --arch=arm64 bookworm"]
    [pin] = bases_made.pins.values()
    assert planted not in pin and pin.endswith(tag_digest(reg, f"bookworm-slim-arm64-{KEY}"))  # type: ignore[arg-type]
    out = lines(capsys)
    assert out[0].startswith(f"base {ARM_KEYED}: bootstrapping: the signature of `{ARM_KEYED}` "
                             "did not verify")


def test_without_a_signer_the_keyed_tag_is_never_written(world, arm, capsys):
    """A run that cannot sign (`builder base`, no key) pushes under the floating tag only: a
    signed base of today stays where a publish runner verifies it."""
    reg, _ = world
    m, v, ran, content = arm
    key = new_key()
    signed = made(m, v, bases.BaseOptions(Vouchers((key.public,)), key)).digests
    content[0] = b"Debian moved on"
    unsigned = made(m, v, bases.BaseOptions())
    assert ran == ["mmdebstrap --arch=arm64 bookworm"] * 2 and unsigned.digests != signed
    assert tag_digest(reg, "bookworm-slim-arm64") != tag_digest(reg, f"bookworm-slim-arm64-{KEY}")
    out = lines(capsys)
    assert out[-2] == f"base {ARM_KEYED}: bootstrapping: {bases.NO_KEY}"
    assert out[-1].endswith(", unsigned: as `bookworm-slim-arm64` only")
    assert bases.known_digests(m, [v], Vouchers((key.public,))) == signed


def test_a_signer_not_among_the_trusted_keys_takes_its_own_base(world, arm):
    m, v, ran, _ = arm
    options = bases.BaseOptions(Vouchers((new_key().public,)), new_key())
    assert made(m, v, options) == made(m, v, options)
    assert ran == ["mmdebstrap --arch=arm64 bookworm"]


def test_a_plan_reads_a_foreign_base_digest_only_from_a_verified_bootstrap(
        world, arm, tmp_path, monkeypatch):
    reg, _ = world
    m, v, _ran, _ = arm
    key = new_key()
    digest = bases.ensure(m, v, bases.BaseOptions(Vouchers((key.public,)), key))
    plant(reg, tmp_path, "bookworm-slim-arm64")
    key_of = platforms.base_key(v.base.image, v.platform)
    guess = base.registry_base_digest(reg, "torch-base", "bookworm-slim-arm64")  # type: ignore[arg-type]
    assert bases.known_digests(m, [v], NOBODY) == {key_of: guess} != {key_of: digest}  # no key
    assert bases.known_digests(m, [v], Vouchers((key.public,))) == {key_of: digest}
    assert bases.known_digests(m, [v], Vouchers((new_key().public,))) == {key_of: None}


def test_a_publish_never_takes_an_older_signed_base_that_the_floating_tag_points_at(
        world, arm, monkeypatch):
    """Yesterday's signed base is still signed: a floating tag moved back to it must not give
    the plan its (older) digest, or a rolled-back image would be published. Unknown → build."""
    m, v, _ran, _ = arm
    key = new_key()
    bases.ensure(m, v, bases.BaseOptions(Vouchers((key.public,)), key))
    monkeypatch.setattr(base, "bootstrap_key", lambda suite, day=None, options=(): "f" * 16)
    key_of = platforms.base_key(v.base.image, v.platform)
    assert bases.known_digests(m, [v], Vouchers((key.public,))) == {key_of: None}


def test_rebuild_check_reads_todays_signed_base_or_bootstraps_without_pushing(world, arm):
    reg, _ = world
    m, v, ran, content = arm
    key = new_key()
    digest = bases.ensure(m, v, bases.BaseOptions(Vouchers((key.public,)), key))
    before = dict(reg.manifests)
    assert bases.foreign_digest_now(m, "bookworm", ARM, Vouchers((key.public,))) == digest
    content[0] = b"Debian moved on"
    moved = bases.foreign_digest_now(m, "bookworm", ARM, NOBODY)
    assert moved != digest and ran == ["mmdebstrap --arch=arm64 bookworm"] * 2
    assert reg.manifests == before  # nothing written


# ---- a later day: plan/publish find the signed base an image was staged on -------------------

STAGED_ON = dt.date(2026, 12, 5)


def keyed_by_day(suite: str, day: dt.date | None = None, options: tuple[str, ...] = ()) -> str:
    """The staging build's key is KEY (its day, STAGED_ON); any other day's is its own."""
    return KEY if day in (None, STAGED_ON) else f"{day:%Y%m%d}".ljust(16, "0")


@pytest.mark.parametrize(("days_later", "found"), [(1, True), (bases.STAGED_DAYS, True),
                                                   (bases.STAGED_DAYS + 1, False)])
def test_a_fresh_runner_on_a_later_day_finds_the_base_the_image_was_staged_on(
        world, cpu, capsys, monkeypatch, days_later, found):
    """Staged at 23:59:59, published after midnight by a runner without the base: no base of
    the publish day is signed yet, so the newest signed one (the build day's) gives the digest,
    for STAGED_DAYS days."""
    key = new_key()
    digest = stage_with(world, cpu, key, capsys)
    world[1]("fresh")
    monkeypatch.setattr(base, "known_digests", lambda _v, _m=None: {})
    monkeypatch.setattr(base, "bootstrap_key", keyed_by_day)
    monkeypatch.setattr(bases.clock, "day", lambda: STAGED_ON + dt.timedelta(days=days_later))
    m, v = cpu
    key_of = platforms.base_key(v.base.image, v.platform)
    assert bases.known_digests(m, [v], Vouchers((key.public,))) == ({key_of: digest} if found else {})


def test_a_newer_base_that_does_not_verify_never_gives_way_to_an_older_one(
        world, arm, monkeypatch, tmp_path):
    """Someone with push rights plants a base under the next day's keyed tag: the plan's base
    is unknown (→ build or refuse), not the older signed one."""
    reg, _ = world
    m, v, _ran, _ = arm
    key = new_key()
    signed = bases.ensure(m, v, bases.BaseOptions(Vouchers((key.public,)), key))
    monkeypatch.setattr(base, "bootstrap_key", keyed_by_day)
    monkeypatch.setattr(bases.clock, "day", lambda: STAGED_ON + dt.timedelta(days=1))
    key_of = platforms.base_key(v.base.image, v.platform)
    assert bases.known_digests(m, [v], Vouchers((key.public,))) == {key_of: signed}
    plant(reg, tmp_path, f"bookworm-slim-arm64-{keyed_by_day('bookworm', STAGED_ON.replace(day=6))}")
    assert bases.known_digests(m, [v], Vouchers((key.public,))) == {key_of: None}
