"""Facts derived from resolved wheels; deterministic, injection-proof rendering; the plan."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from builder.core.errors import ConfigError
from builder.model import lockfile
from builder.stages import locks, plan, render

ROOT = Path(__file__).resolve().parents[3]
LOCKS = ROOT / "locks"


@pytest.mark.parametrize("variant_id,cuda,cudnn,nccl,driver", [
    ("2.5.1-py3.11-cuda-runtime", "12.4", "9.1.0", "2.21.5", "550.54.14"),
    ("2.7.1-py3.11-cuda-runtime", "12.6", "9.5.1", "2.26.2", "560.28.03"),
    ("2.9.1-py3.11-cuda-runtime", "12.8", "9.10.2", "2.27.5", "570.26"),
])
def test_cuda12_facts_come_from_suffixed_wheels(shipped, variant_id, cuda, cudnn, nccl, driver):
    v = shipped.variant(variant_id)
    text = (LOCKS / f"{variant_id}.txt").read_text()
    facts = locks.derive_facts(v, text)
    assert (facts["cuda"], facts["cudnn"], facts["nccl"], facts["min_driver"]) == (
        cuda, cudnn, nccl, driver)
    assert re.search(r"^nvidia-cudnn-cu12==", text, re.M)


def test_cuda13_facts_come_from_unsuffixed_wheels(shipped):
    v = shipped.variant("2.15.0-py3.11-cuda-runtime")
    text = (LOCKS / f"{v.id}.txt").read_text()
    assert re.search(r"^nvidia-cuda-runtime==13\.", text, re.M)
    assert re.search(r"^nvidia-cudnn-cu13==", text, re.M)
    facts = locks.derive_facts(v, text)
    assert facts["cuda"] == "13.2" and facts["cudnn"].startswith("9.")
    assert facts["min_driver"] == "580.65.06"
    assert facts["min_driver_basis"] == "minor-version compatibility"


def test_every_shipped_lock_is_fully_hash_pinned(shipped):
    for v in shipped.variants:
        lock = lockfile.require_lock(LOCKS, v)
        blocks = render.split_requirements(lock.text)
        assert blocks, v.id
        for name, block in blocks:
            assert re.match(r"^[A-Za-z0-9._-]+==\S+", block), (v.id, name)
            assert "--hash=sha256:" in block, (v.id, name)
        assert lockfile.is_current(LOCKS, v), f"{v.id}: lock inputs changed; run builder lock"


def test_devel_cuda13_pins_the_whole_toolkit_to_torch_minor(shipped):
    v = shipped.variant("2.15.0-py3.11-cuda-devel")
    pins = lockfile.require_lock(LOCKS, v).pins
    for name in lockfile.TOOLKIT_WHEELS:
        assert pins[name].startswith("13.2."), name


def test_facts_checks_refuse_devel_without_toolkit(shipped):
    v = shipped.variant("2.9.1-py3.11-cuda-devel")
    facts = dict(lockfile.require_lock(LOCKS, v).facts, cuda="12.1")
    problems = locks.check_facts(v, facts, shipped)
    assert any("no toolkit source for CUDA 12.1" in p for p in problems)


def test_render_is_byte_for_byte_deterministic(shipped):
    """Two renders of every shipped variant, the same bytes: what `render.write` puts in
    DIR/<id>/ (its Dockerfile, .dockerignore and context files), compared in memory."""
    def rendered_bytes() -> str:
        digest = hashlib.sha256()
        for v in shipped.variants:
            r = render.render(shipped, v, lockfile.require_lock(LOCKS, v),
                              lockfile.read_base_lock(LOCKS, v))
            for rel, text in sorted({"Dockerfile": r.dockerfile,
                                     "Dockerfile.dockerignore": r.dockerignore,
                                     **r.files}.items()):
                digest.update(f"{r.variant.key}/{rel}\0{text}\0".encode())
        return digest.hexdigest()

    assert rendered_bytes() == rendered_bytes()


def test_flavors_differ_as_documented(shipped):
    def dockerfile(vid: str) -> str:
        v = shipped.variant(vid)
        return render.render(shipped, v, lockfile.require_lock(LOCKS, v),
                             lockfile.read_base_lock(LOCKS, v)).dockerfile

    runtime = dockerfile("2.15.0-py3.11-cuda-runtime")
    slim = dockerfile("2.15.0-py3.11-cuda-slim")
    devel = dockerfile("2.15.0-py3.11-cuda-devel")
    devel12 = dockerfile("2.9.1-py3.11-cuda-devel")
    assert "USER 1000:1000" in runtime and "build-essential" not in runtime
    assert 'NVIDIA_REQUIRE_CUDA="cuda>=13.0"' in runtime
    assert "-name '*.a'" in slim and 'io.torch-images.dropped="triton' in slim
    assert "build-essential" in devel and "CUDA_HOME=" in devel
    assert "FROM nvidia/cuda:12.8.1-devel-ubuntu22.04 AS toolkit" in devel12
    assert "--require-hashes" in runtime and "pip install --no-index" in runtime  # uv itself


def test_dockerfile_value_refuses_shell_characters():
    for evil in ("a\nRUN x", 'a"b', "a;b", "$(id)", "a`b`", "a'b", "a|b", "a&b"):
        with pytest.raises(ConfigError):
            render.dockerfile_value(evil)
    assert render.dockerfile_value("nvidia/cuda:12.8.1-devel-ubuntu22.04") == \
        "nvidia/cuda:12.8.1-devel-ubuntu22.04"


def test_tags_and_content_hash(shipped):
    v = shipped.variant("2.9.1-py3.11-cuda-runtime")
    facts = lockfile.require_lock(LOCKS, v).facts
    assert plan.tag_for(v, facts) == "2.9.1-py3.11-cuda12.8-cudnn9-runtime"
    cpu = shipped.variant("2.13.0-py3.11-cpu-runtime")
    assert plan.tag_for(cpu, {"cuda": None}) == "2.13.0-py3.11-cpu-runtime"
    slim = shipped.variant("2.15.0-py3.11-cuda-slim")
    p1 = plan.plan_variant(shipped, render.render_locked(shipped, slim, LOCKS), "sha256:aaa", "s")
    p2 = plan.plan_variant(shipped, render.render_locked(shipped, slim, LOCKS), "sha256:bbb", "s")
    p3 = plan.plan_variant(shipped, render.render_locked(shipped, slim, LOCKS), "sha256:aaa", "s")
    assert p1.content_hash != p2.content_hash and p1.content_hash == p3.content_hash
    assert "latest-slim" in p1.tags


@pytest.mark.parametrize("variant_id", ["2.13.0-py3.11-cpu-runtime", "2.15.0-py3.11-cuda-devel"])
def test_a_security_relock_keeps_every_other_pin(shipped, tmp_path, monkeypatch, variant_id):
    """`rebuild` re-locks through the one lock store: the current pins go to uv as the existing
    output, only the vulnerable package may move, and both of a devel lock's files are kept in
    step."""
    variant = next(v for v in shipped.variants if v.id == variant_id)
    for name in (f"{variant_id}.txt", f"{variant_id}.json", f"{variant_id}.base.txt"):
        if (LOCKS / name).exists():
            (tmp_path / name).write_bytes((LOCKS / name).read_bytes())
    calls = []

    def fake_resolve(v, reqs, *, upgrade=False, current=None, upgrade_packages=()):
        calls.append((current is not None, tuple(upgrade_packages)))
        return re.sub(r"(?m)^jinja2==\S+", "jinja2==9.9.9", current)

    monkeypatch.setattr(locks, "resolve", fake_resolve)
    assert locks.lock_variant(shipped, variant, tmp_path, upgrade_packages=["jinja2"])[1]
    assert calls and all(c == (True, ("jinja2",)) for c in calls)
    assert len(calls) == (2 if variant.flavor == "devel" else 1)
    assert "jinja2==9.9.9" in (tmp_path / f"{variant_id}.txt").read_text()
    assert lockfile.stale_reason(tmp_path, variant) is None

    monkeypatch.setattr(locks, "resolve", lambda v, reqs, **kw: kw["current"])
    assert not locks.lock_variant(shipped, variant, tmp_path, upgrade_packages=["jinja2"])[1]
