"""bench/pullreport.py: results.json keeps what other runs measured (other variants, other
containerds, other benches' entries), and bench/PULL.md has a CRI table and goals per
containerd."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import pullreport

T = {"s": 10.0, "load": 1.0}
WS = {"bytes": 1_180_000_000, "files": 3400, "image_bytes": 4_540_000_000,
      "image_files": 5000, "share": 0.26, "files_share": 0.68, "top": [["/lib.so", 9]]}
FACTS = {"system": {"name": "system", "version": "1.6.20~ds1 1.6.20~ds1-1+deb12u3",
                    "go": "go1.19.8", "source": "/usr/bin/containerd on PATH",
                    "unpigz": "/usr/bin/unpigz"},
         "debian-13": {"name": "debian-13", "version": "1.7.24~ds1 1.7.24~ds1-6+deb13u1",
                       "go": "go1.24.4", "source": "deb.debian.org trixie …", "unpigz": ""}}


def cri_run(to_matmul: float, cpu: float, own: float) -> dict:
    return {"s": to_matmul - 4, "start_s": 4.0, "to_matmul_s": to_matmul, "cpu_s": cpu,
            "cpu_own_s": own, "cpu_children_s": cpu - own, "bytes": 2e9, "load": 1.0}


def record(variant: str, started: str, **cri: tuple[float, float]) -> dict:
    """A variant's record; `cri`: per containerd, the zstd / gzip ratios (wall, CPU)."""
    return {"id": variant, "started": started, "gzip_digest": "sha256:g", "twin_runs": "",
            "twin": {"twin": "sha256:z", "layers": 9, "zstd_bytes": 9, "gzip_bytes": 10,
                     "tar_bytes": 20, "hwm_mb": 200.0, "hwm_promote_mb": 80.0,
                     "twin_s": 30.0, "promote_s": 17.0, "promote_load": 1.0,
                     "twin_load": 1.0, "workers": 2},
            "pull": {"gzip": T, "zstd": T}, "split": {k: {"fetch": T, "unpack": T}
                                                      for k in ("gzip", "zstd")},
            "parts": {"floor_tar_x": {**T, "sync_s": 1.0}, "unpigz_dc": T, "zstd_dc": T,
                      "sha256_gzip": T, "sha256_zstd": T, "sha256_tar": T, "tar_bytes": 20},
            "cri": {name: {"containerd": FACTS[name], "gzip": cri_run(40.0, 40.0, 30.0),
                           "zstd": cri_run(40.0 * wall, 40.0 * cpu, 30.0 * cpu)}
                    for name, (wall, cpu) in cri.items()},
            "working_set": None}


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(pullreport, "containerd_version", lambda: "1.6.20~ds1")
    (tmp_path / "PULL-earlier.md").write_text("## Earlier runs (kept by hand)\n")
    return tmp_path


def test_writing_one_variant_keeps_the_others_and_the_other_benches(here: Path) -> None:
    legacy_cpu = {**record(pullreport.CUDA_SLIM, "x"), "id": "cpu-runtime", "started": None,
                  "working_set": WS}
    legacy_cpu["cri"] = {"gzip": cri_run(10.0, 9.0, 8.0), "zstd": cri_run(8.0, 5.0, 5.0)}
    (here / "results.json").write_text(json.dumps({
        "siblings": {"kept": True}, "mode": "quick",
        "pull": {"started": "2026-12-06T04:10:00Z", "results": [legacy_cpu]}}))
    pullreport.write([record(pullreport.CUDA_SLIM, "2026-12-06T15:02:00Z", system=(0.8, 0.7))],
                     "2026-12-06T15:02:00Z", 2, here)
    data = json.loads((here / "results.json").read_text())
    assert data["siblings"] == {"kept": True} and data["mode"] == "quick"
    cpu, cuda = data["pull"]["results"]
    assert (cpu["id"], cpu["started"], cpu["working_set"]) == ("cpu-runtime",
                                                               "2026-12-06T04:10:00Z",
                                                               WS)
    assert cpu["cri"]["system"]["containerd"]["go"] == "go1.19.8"  # the one it ran on then
    assert cuda["started"] == "2026-12-06T15:02:00Z"


def test_a_run_on_one_containerd_keeps_the_variants_runs_on_another() -> None:
    held = [record("v", "then", system=(0.8, 0.7), **{"debian-13": (0.6, 0.5)})]
    [merged] = pullreport.merge(held, [record("v", "now", system=(0.9, 0.9))], None)
    assert merged["started"] == "now" and list(merged["cri"]) == ["system", "debian-13"]
    assert merged["cri"]["system"]["zstd"]["to_matmul_s"] == 36.0


def test_the_report_has_a_table_and_goals_per_containerd(here: Path) -> None:
    both = record(pullreport.CUDA_SLIM, "2026-12-06T15:02:00Z", system=(0.88, 0.74),
                  **{"debian-13": (0.68, 0.5)})
    pullreport.write([both], "2026-12-06T15:02:00Z", 2, here)
    text = (here / "PULL.md").read_text()
    assert "### containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3, built with go1.19.8" in text
    assert "### containerd 1.7.24~ds1 1.7.24~ds1-6+deb13u1, built with go1.24.4" in text
    goals = text.split("## Goals")[1].split("##")[0]
    assert ("(go1.19.8, `system`): time to the first matmul 0.88 (goal ≤ 0.7): NOT met; "
            "containerd CPU-seconds 0.74 (goal ≤ 0.55): NOT met") in goals
    assert ("(go1.24.4, `debian-13`): time to the first matmul 0.68 (goal ≤ 0.7): met; "
            "containerd CPU-seconds 0.50 (goal ≤ 0.55): met") in goals
    assert "its children (cutime+cstime)" in text and "unpigz on its PATH" in text
    assert text.rstrip().endswith("## Earlier runs (kept by hand)")


def test_the_working_set_is_the_first_figure_beside_the_ctr_path() -> None:
    figs = pullreport.figures({**record("x", "now", system=(0.8, 0.7)), "working_set": WS})
    assert figs[0].name == "startup working set: bytes a cold start read (x)"
    assert figs[1].name.startswith("`ctr` pull+unpack")


def test_the_goal_line_and_the_table_print_one_ratio(here: Path) -> None:
    """29.9 / 51.1 = 0.5851: both print 0.59 (a ratio kept to 3 places, 0.585, printed 0.58)."""
    run = record(pullreport.CUDA_SLIM, "now", system=(0.8, 0.5))
    run["cri"]["system"]["gzip"]["cpu_s"], run["cri"]["system"]["zstd"]["cpu_s"] = 51.1, 29.9
    pullreport.write([run], "now", 2, here)
    text = (here / "PULL.md").read_text()
    assert "containerd CPU-seconds 0.59 (goal ≤ 0.55): NOT met" in text
    assert "| 29.9 s | 51.1 s | 0.59 |" in text


def test_a_zero_baseline_never_meets_a_goal() -> None:
    assert pullreport.judged(pullreport.goal_ratio(10.0, 0.0), 0.55) == "NOT met"
    assert pullreport.goal_ratio(29.9, 51.1) == 0.5851


def test_containerds_own_cpu_over_a_zero_baseline_is_infinite_not_a_crash() -> None:
    zs, gz = {"cpu_own_s": 15.0, "cpu_children_s": 0.0}, {"cpu_own_s": 0.0, "cpu_children_s": 17.0}
    assert pullreport.own_cpu_ratio(zs, gz) == float("inf")
    assert "(inf), its children" in pullreport.cpu_parts(zs, gz, {"unpigz": "/usr/bin/unpigz"})
