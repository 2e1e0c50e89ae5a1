"""What `builder verify REGISTRY/REPOSITORY:TAG` checks about TAG itself, beyond the digest it
resolves to: that TAG is among the tags signed for that digest (publish signs them in the
cosign payload's `optional` map), that the image's labels say what TAG says (torch, python,
accelerator, CUDA, cuDNN, flavor; `build-<hash>` its content hash) on every platform, and that a
floating tag is not rolled back to an older publication than the latest dated one, unless a
trusted key signed that rollback while that one was the newest (builder.flows.rollback).
"""

from __future__ import annotations

import re
from typing import Any

from builder.core import clock, labels, oci, sign
from builder.flows import rollback as rollback_flow
from builder.model import tags as tag_rules

# A floating tag, maybe dated, maybe a zstd twin (builder.stages.twin: `<tag>-zstd`):
# `<torch>-py<python>-<cpu|cudaX.Y-cudnnN>-<flavor>[-YYYYMMDD[.n]][-zstd]`
FLOATING = re.compile(
    r"(?P<torch>[0-9][0-9A-Za-z.]*)-py(?P<python>[0-9.]+)-"
    r"(?:(?P<cpu>cpu)|cuda(?P<cuda>[0-9.]+)-cudnn(?P<cudnn>[0-9]+))-"
    r"(?P<flavor>devel|runtime|slim)(?P<date>-[0-9]{8}(?:\.[0-9]+)?)?(?P<twin>-zstd)?")

Finding = tuple[str, bool, str]  # (what, passed, detail)


def findings(reg: oci.Registry, repository: str, tag: str, digest: str,
             platform_labels: list[dict[str, str]],
             payloads: list[dict[str, Any]] | None,
             keys: tuple[Any, ...] = ()) -> list[Finding]:
    """The checks of TAG; `payloads`: the verified signature payloads of the digest (None when
    no key was given: the signed-tag and rollback checks need them); `keys`: the trusted keys,
    with which only dated tags signed for their digest count as publications."""
    out: list[Finding] = []
    signed: set[str] = set()
    if payloads is not None:
        for payload in payloads:
            signed |= sign.signed_tags(payload.get("optional"))
        ok = tag in signed
        out.append(("tag signed", ok, f"`{tag}` is among the tags signed for {digest[:19]}" if ok
                    else f"`{tag}` is not among the tags signed for {digest[:19]} (signed: "
                    f"{', '.join(sorted(signed)) or 'none'})"))
    if wrong := label_problems(tag, platform_labels):
        out.append(("tag", False, f"`{tag}` names another image: {wrong}"))
    elif FLOATING.fullmatch(tag) or tag.startswith(tag_rules.HASH_TAG_PREFIX):
        out.append(("tag", True, f"`{tag}` agrees with the labels of every platform"))
    if payloads is not None:
        out += rollback(reg, repository, tag, digest, payloads, keys)
    return out


def label_problems(tag: str, platform_labels: list[dict[str, str]]) -> str:
    """What the labels of some platform say against TAG's grammar ('' when they agree, or
    when TAG is an alias, which has no grammar)."""
    problems: list[str] = []
    if tag.startswith(tag_rules.HASH_TAG_PREFIX):
        # a zstd twin's `build-<hash>-zstd` names the same content hash (builder.stages.twin)
        want = tag.removeprefix(tag_rules.HASH_TAG_PREFIX).removesuffix("-zstd")
        for found in platform_labels:
            have = found.get(labels.CONTENT_HASH) or ""
            if not have.startswith(want) or not want:
                problems.append(f"content hash {want} ≠ label {have[:len(want) or 20]!r}")
    elif match := FLOATING.fullmatch(tag):
        for found in platform_labels:
            problems += _grammar_problems(match, found)
    return "; ".join(dict.fromkeys(problems))


def _grammar_problems(match: re.Match[str], found: dict[str, str]) -> list[str]:
    accel = "cpu" if match["cpu"] else "cuda"
    have = {"torch": (found.get(labels.TORCH) or "").split("+")[0],
            "python": found.get(labels.PYTHON) or "",
            "accelerator": found.get(labels.ACCELERATOR) or "",
            "flavor": found.get(labels.FLAVOR) or ""}
    want = {"torch": match["torch"], "python": match["python"], "accelerator": accel,
            "flavor": match["flavor"]}
    wrong = [f"{k} {want[k]} ≠ label {v!r}" for k, v in have.items() if want[k] != v]
    for key, label in (("cuda", labels.CUDA), ("cudnn", labels.CUDNN)):
        value = found.get(label) or ""
        if match[key] and not (value == match[key] or value.startswith(match[key] + ".")):
            wrong.append(f"{key} {match[key]} ≠ label {value!r}")
        if not match[key] and value:
            wrong.append(f"no {key} in the tag, label {value!r}")
    return wrong


def rollback(reg: oci.Registry, repository: str, tag: str, digest: str,
             payloads: list[dict[str, Any]], keys: tuple[Any, ...] = ()) -> list[Finding]:
    """A floating tag (or an alias) on an older publication than the latest: a signed rollback
    when a verified signature of the digest rolled `tag` back while that latest was the newest
    (builder.flows.rollback), else a finding."""
    signed = {t for p in payloads for t in sign.signed_tags(p.get("optional"))}
    problem, latest = rolled_back(reg, repository, tag, digest, signed, keys)
    if not problem:
        return []
    if to := rollback_flow.signed_rollback(payloads, tag, latest):
        return [("signed rollback", True, f"`{tag}` is a signed rollback to `{to}` from "
                 f"`{latest}`, made by a trusted key")]
    return [("tag rollback", False, problem)]


def rolled_back(reg: oci.Registry, repository: str, tag: str, digest: str,
                signed: set[str], keys: tuple[Any, ...] = ()) -> tuple[str, str]:
    """(why, the latest dated tag) when a floating tag (or an alias: its floating tag is among
    the signed ones) points at an older publication than the latest dated tag of that floating
    tag signed for its digest by one of `keys` (every dated tag without keys); ('', '')
    otherwise."""
    match = FLOATING.fullmatch(tag)
    if match and match["date"]:
        return "", ""  # a dated tag never moves: it is what it was
    floating = tag if match else next((t for t in sorted(signed)
                                       if (m := FLOATING.fullmatch(t)) and not m["date"]), "")
    if not floating or tag.startswith(tag_rules.HASH_TAG_PREFIX):
        return "", ""
    twin = "-zstd" if floating.endswith("-zstd") else ""  # a twin's dated tags are twins too
    dated = re.compile(re.escape(floating.removesuffix(twin))
                       + r"-(?P<date>[0-9]{8})(?:\.(?P<n>[0-9]+))?" + re.escape(twin))
    now = clock.stamp()  # a tag dated later is no publication (builder.flows.record)
    found = sorted(((m["date"], int(m["n"] or 0), t) for t in reg.tags(repository)
                    if (m := dated.fullmatch(t)) and m["date"] <= now), reverse=True)
    latest, head = newest_signed(reg, repository, [t for *_, t in found], keys)
    if head is None or head.digest == digest:
        return "", ""
    own = sorted((d, n, t) for d, n, t in found if t in signed)
    what = f"the publication of `{own[-1][2]}`" if own else f"{digest[:19]}"
    return (f"`{tag}` is rolled back: it points at {what}, older than the latest dated "
            f"publication `{latest}` ({head.digest[:19]})"), latest


def newest_signed(reg: oci.Registry, repository: str, dated: list[str], keys: tuple[Any, ...]
                  ) -> tuple[str, oci.Descriptor | None]:
    """The first of `dated` (newest first) that is a publication: with `keys`, one whose
    digest a trusted key signed naming that tag (a forged dated tag is anyone's)."""
    for tag in dated:
        head = reg.head(repository, tag)
        if head is not None and (not keys or sign.names_tag(reg, repository, head.digest, tag,
                                                            keys)):
            return tag, head
    return "", None
