"""`plan` with the registry down: one line and exit 2, never every variant silently `build`;
`plan --offline` plans what it can and marks what it could not ask `unknown`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from builder import cli
from builder.core.errors import BuilderError
from builder.stages import base, plan

ROOT = Path(__file__).resolve().parents[3]
CPU = "2.13.0-py3.11-cpu-runtime"


@pytest.fixture
def down_matrix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shipped matrix pointed at a registry nothing answers (and no engine to ask)."""
    monkeypatch.setattr(plan, "engine_available", lambda _engine: False)
    monkeypatch.setattr(base, "known_digests", lambda *_args: {})

    def refused(*_args, **_kwargs):
        raise OSError("[Errno 111] Connection refused")

    monkeypatch.setattr(plan.oci.Registry, "head", refused)
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data["registry"] = "127.0.0.1:9"
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_plan_with_the_registry_down_says_so_in_one_line(
        down_matrix: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["plan", "--matrix", str(down_matrix), "--locks", str(ROOT / "locks"),
                     "--select", f"id={CPU}"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, err
    assert len(errors) == 1 and "127.0.0.1:9" in errors[0] and "Connection refused" in errors[0]
    assert "--offline" in err


def test_plan_offline_marks_what_it_could_not_ask_unknown(
        down_matrix: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["plan", "--offline", "--json", "--matrix", str(down_matrix),
                     "--locks", str(ROOT / "locks"), "--select", f"id={CPU}"])
    out = capsys.readouterr().out
    assert code == 0
    [row] = json.loads(out)["include"]
    assert row["id"] == CPU and row["state"] == "unknown" and len(row["content_hash"]) == 64


def test_registry_has_still_reads_an_unreachable_registry_as_no(
        down_matrix: Path) -> None:
    with pytest.raises(BuilderError, match="cannot ask the registry"):
        plan.ask_registry("127.0.0.1:9", "torch", "t")
    assert plan.registry_has("127.0.0.1:9", "torch", "t") is False


def test_an_unsigned_build_tag_is_not_up_to_date(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Anyone with push rights can write `build-<hash>`: with trusted keys it counts only when
    one of them signed that tag for its digest."""
    from builder.core import oci
    from builder.core.keypair import NOBODY, Vouchers
    from builder.model import matrix

    digest = "sha256:" + "a" * 64
    monkeypatch.setattr(plan.oci.Registry, "head",
                        lambda _self, _repo, _tag: oci.Descriptor(digest, oci.OCI_MANIFEST, 1))
    signed = {"build-good"}
    monkeypatch.setattr(plan.vouch, "names_tag", lambda _r, _repo, d, tag, _k: tag in signed)
    m = matrix.load(ROOT / "matrix.yaml")
    assert plan.registry_holds(m, "build-good", Vouchers(("trusted",)))
    assert not plan.registry_holds(m, "build-forged", Vouchers(("trusted",)))
    assert "`build-forged` is not signed by a trusted key or identity" in capsys.readouterr().err
    assert plan.registry_holds(m, "build-forged", NOBODY)  # no keys: the tag alone, as before
