"""Known vulnerabilities of an SBOM's components, per source, never silently clean.

- Python: pip-audit (PyPI's vulnerability data) on `name==version` of every pypi component.
- Debian: the security suite's Packages index; an installed version older than the suite's is
  reported with the fixed version (dpkg version order) and, as `aliases`, the CVE ids the fixed
  package's Debian changelog names since the installed version (sbom/debian_changelog.py).

Each source gets a status: ok, unreachable or error. Components a source could not judge are
listed as unknown, so "no findings" only ever means "checked and clean".
"""

from __future__ import annotations

import json
import lzma
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from packageurl import PackageURL
from packaging.version import InvalidVersion, Version

from builder.core import proc
from builder.core.errors import CommandFailed
from sbom import debian_changelog, dpkg
from sbom.diff import iter_components
from sbom.pydist import normalize

DEBIAN_SECURITY_MIRROR = "http://deb.debian.org/debian-security"
_NETWORK_HINTS = (
    "ConnectionError", "Max retries exceeded", "NameResolution", "ProxyError", "timed out",
    "Connection refused", "Temporary failure in name resolution", "ConnectTimeout",
)


def audit(
    sbom: dict[str, Any],
    *,
    debian_security_suite: str = "bookworm-security",
    debian_mirror: str = DEBIAN_SECURITY_MIRROR,
    timeout: float = 120,
) -> dict[str, Any]:
    """{"sources": {name: {status, detail, checked}}, "vulnerabilities", "unknown", "ok"}."""
    comps = list(iter_components(sbom))
    pypi, deb = _by_type(comps, "pypi"), _by_type(comps, "deb")
    results = [
        audit_python(pypi, timeout=timeout),
        audit_debian(deb, suite=debian_security_suite, mirror=debian_mirror, timeout=timeout),
    ]
    report: dict[str, Any] = {"sources": {}, "vulnerabilities": [], "unknown": []}
    for name, source in results:
        report["sources"][name] = source["status"]
        report["vulnerabilities"] += source["vulnerabilities"]
        report["unknown"] += source["unknown"]
    report["ok"] = not report["vulnerabilities"] and all(
        s["status"] == "ok" for s in report["sources"].values())
    return report


def _by_type(comps: list[dict[str, Any]], purl_type: str) -> list[tuple[PackageURL, str]]:
    found: dict[str, tuple[PackageURL, str]] = {}
    for comp in comps:
        try:
            purl = PackageURL.from_string(comp.get("purl") or "")
        except ValueError:
            continue
        if purl.type == purl_type and purl.version:
            found[comp.get("bom-ref") or comp["purl"]] = (purl, comp.get("bom-ref") or comp["purl"])
    return [found[k] for k in sorted(found)]


def _source(status: str, detail: str, checked: int, **extra: Any) -> dict[str, Any]:
    return {"status": status, "detail": detail, "checked": checked, **extra}


def _vuln(source: str, ref: str, purl: PackageURL, vid: str, **extra: Any) -> dict[str, Any]:
    return {"id": vid, "source": source, "ref": ref, "name": purl.name,
            "version": purl.version, **extra}


def _unknown(ref: str, purl: PackageURL, reason: str) -> dict[str, Any]:
    return {"ref": ref, "name": purl.name, "version": purl.version, "reason": reason}


# ---- Python -----------------------------------------------------------------------------------


def audit_python(
    packages: list[tuple[PackageURL, str]], *, timeout: float = 120
) -> tuple[str, dict[str, Any]]:
    out: dict[str, Any] = {"vulnerabilities": [], "unknown": []}
    auditable: dict[str, tuple[PackageURL, str]] = {}
    for purl, ref in packages:
        reason = _unauditable(purl.version or "")
        if reason:
            out["unknown"].append(_unknown(ref, purl, reason))
        else:
            auditable.setdefault(purl.name, (purl, ref))
    if not auditable:
        out["status"] = _source("ok", "no PyPI-released Python packages to check", 0)
        return "pypi", out
    status, data = _run_pip_audit(auditable, timeout)
    if data is not None:
        status = _read_pip_audit(data, auditable, out)
    else:  # not asked is not clean: each package is a row of its own, `unknown`
        out["unknown"] += [_unknown(ref, purl, f"PyPI's advisory data: {status['status']}")
                           for purl, ref in auditable.values()]
    out["status"] = status
    return "pypi", out


def _unauditable(version: str) -> str:
    try:
        parsed = Version(version)
    except InvalidVersion:
        return "not a PEP 440 version"
    if parsed.local:
        return f"local version `+{parsed.local}` is not on PyPI; unknown, not clean"
    return ""


def _run_pip_audit(
    auditable: dict[str, tuple[PackageURL, str]], timeout: float
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    with tempfile.TemporaryDirectory(prefix="sbom-audit-") as tmp:
        req = Path(tmp, "requirements.txt")
        req.write_text("".join(f"{n}=={p.version}\n" for n, (p, _) in sorted(auditable.items())))
        argv = ["pip-audit", "-r", req, "--no-deps", "--disable-pip", "-f", "json",
                "--progress-spinner", "off", "--cache-dir", Path(tmp, "cache")]
        try:
            result = proc.run(argv, check=False, timeout=timeout)
        except CommandFailed as exc:  # timeout
            return _source("unreachable", str(exc), 0), None
    stderr = result.stderr or ""
    if result.returncode in (0, 1):
        try:
            return _source("ok", "", len(auditable)), json.loads(result.stdout)
        except json.JSONDecodeError:
            pass
    tail = "\n".join(stderr.strip().splitlines()[-5:])
    kind = "unreachable" if any(h in stderr for h in _NETWORK_HINTS) else "error"
    return _source(kind, f"pip-audit exited with {result.returncode}: {tail}", 0), None


def _read_pip_audit(
    data: dict[str, Any], auditable: dict[str, tuple[PackageURL, str]], out: dict[str, Any]
) -> dict[str, Any]:
    answered = 0
    for dep in data.get("dependencies", []):
        name = normalize(dep.get("name", ""))
        purl, ref = auditable.get(name, (None, ""))
        if purl is None:
            continue
        if "skip_reason" in dep:
            out["unknown"].append(_unknown(ref, purl, dep["skip_reason"]))
            continue
        answered += 1
        for v in dep.get("vulns", []):
            out["vulnerabilities"].append(_vuln(
                "pypi", ref, purl, v["id"], fix_versions=v.get("fix_versions", []),
                aliases=v.get("aliases", []), description=v.get("description", "")))
    if not answered:
        # PyPI answered nothing for any release: its vulnerability API is not usable from here.
        return _source("unreachable", "PyPI's JSON API knew none of the releases (blocked or "
                       "offline?); every package is unknown", len(auditable))
    return _source("ok", "", len(auditable), answered=answered)


# ---- Debian -----------------------------------------------------------------------------------


def audit_debian(
    packages: list[tuple[PackageURL, str]], *, suite: str, mirror: str, timeout: float = 120
) -> tuple[str, dict[str, Any]]:
    name = "debian-security"
    out: dict[str, Any] = {"vulnerabilities": [], "unknown": []}
    if not packages:
        out["status"] = _source("ok", "no Debian packages to check", 0, suite=suite)
        return name, out
    arches = sorted({p.qualifiers.get("arch", "amd64") for p, _ in packages} - {"all"} | {"all"})
    try:
        filenames: dict[str, str] = {}
        fixed = security_versions(mirror, suite, arches, timeout=timeout, filenames=filenames)
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        out["status"] = _source("unreachable", f"{mirror}: {exc}", 0, suite=suite)
        out["unknown"] = [_unknown(ref, p, f"{suite} unreachable") for p, ref in packages]
        return name, out
    except (lzma.LZMAError, ValueError) as exc:
        out["status"] = _source("error", f"cannot read {suite} Packages: {exc}", 0, suite=suite)
        out["unknown"] = [_unknown(ref, p, f"{suite} unreadable") for p, ref in packages]
        return name, out
    for purl, ref in packages:
        newer = fixed.get(purl.name)
        if newer and dpkg.compare_versions(purl.version or "", newer) < 0:
            cves, why = changelog_cves(mirror, filenames.get(purl.name), purl, timeout)
            out["vulnerabilities"].append(_vuln(
                name, ref, purl, f"{suite}:{purl.name}@{newer}", fix_versions=[newer],
                aliases=cves, cve_source=why,
                description=f"{suite} has a security update for {purl.name}: {newer}"))
    out["status"] = _source("ok", "", len(packages), suite=suite, url=mirror)
    return name, out


def changelog_cves(mirror: str, filename: str | None, purl: PackageURL,
                   timeout: float) -> tuple[list[str], str]:
    """(the CVE ids the fixed package's Debian changelog names since the installed version,
    where they came from or why there are none)."""
    if not filename:
        return [], "unknown: the security suite names no .deb for it"
    try:
        cves = debian_changelog.fixed_cves(mirror, filename, purl.name, purl.version or "",
                                           timeout=timeout)
    except (urllib.error.URLError, OSError, TimeoutError, ValueError, tarfile.TarError) as exc:
        return [], f"unknown: {filename}: {exc}"[:300]
    return cves, f"changelog of {filename}"


def security_versions(
    mirror: str, suite: str, arches: list[str], *, timeout: float = 120,
    filenames: dict[str, str] | None = None,
) -> dict[str, str]:
    """Binary package → highest version in the suite's main Packages indexes for `arches`
    (`filenames`, when given, gets that version's .deb path under the mirror)."""
    versions: dict[str, str] = {}
    for arch in arches:
        url = f"{mirror.rstrip('/')}/dists/{suite}/main/binary-{arch}/Packages.xz"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                text = lzma.decompress(resp.read()).decode("utf-8", errors="replace")
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and arch == "all":
                continue  # suites without a separate binary-all index
            raise
        for st in dpkg.parse_stanzas(text):
            pkg, ver = st.get("Package"), st.get("Version")
            if pkg and ver and (pkg not in versions or
                                dpkg.compare_versions(ver, versions[pkg]) > 0):
                versions[pkg] = ver
                if filenames is not None and st.get("Filename"):
                    filenames[pkg] = st["Filename"]
    return versions


# ---- results into the SBOM --------------------------------------------------------------------

_SOURCES = {
    "pypi": {"name": "PyPI", "url": "https://pypi.org/"},
    "debian-security": {"name": "Debian Security", "url": "https://security-tracker.debian.org/"},
}


def add_to_sbom(sbom: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """A copy of `sbom` with `vulnerabilities` and per-source status properties (unvalidated)."""
    doc = json.loads(json.dumps(sbom))
    vulns = []
    for v in report["vulnerabilities"]:
        entry: dict[str, Any] = {
            "bom-ref": f"vuln:{v['id']}:{v['ref']}",
            "id": v["id"],
            "source": _SOURCES.get(v["source"], {"name": v["source"]}),
            "description": v.get("description") or None,
            "recommendation": ("upgrade to " + " or ".join(v["fix_versions"]))
            if v.get("fix_versions") else None,
            "references": [{"id": a, "source": _SOURCES.get(v["source"], {"name": v["source"]})}
                           for a in v.get("aliases", [])],
            "affects": [{"ref": v["ref"]}],
        }
        vulns.append({k: val for k, val in entry.items() if val})
    doc["vulnerabilities"] = vulns
    props = [p for p in doc.get("properties", []) if not p["name"].startswith("torch-images:audit")]
    for name, status in sorted(report["sources"].items()):
        props.append({"name": f"torch-images:audit.{name}", "value": status["status"]})
    props.append({"name": "torch-images:audit.unknown", "value": str(len(report["unknown"]))})
    doc["properties"] = props
    return doc
