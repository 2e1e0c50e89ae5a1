"""The static site of a catalog document: `index.html` (the chooser), one page per floating and
dated tag, pre-sorted copies of the index (the table sorts without JavaScript), and the charts
as inline SVG drawn here. No external asset: a page works from a file system, an air-gapped web
server or GitHub Pages alike.

The charts are a few rectangles and labels, so they are written by hand rather than with a
plotting library; their colours are CSS classes (`style.css`), so they follow light/dark mode.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup, escape

from builder import __version__
from builder.core import state
from builder.core.output import human_bytes
from builder.model import catalog_page as howto
from builder.model import layer_reuse
from builder.model.catalog_doc import GROUPS
from sbom.diff import COUNTED, change_line

ASSETS = Path(__file__).resolve().parents[1] / "site"
COPIED = ("style.css", "chooser.js")

# Index columns: (key, heading, sort key of a row). Each gets a pre-sorted page.
COLUMNS: tuple[tuple[str, str, Callable[[dict[str, Any]], Any]], ...] = (
    ("tag", "tag", lambda r: r["tag"]),
    ("torch", "torch", lambda r: version_key(r["torch"])),
    ("python", "python", lambda r: version_key(r["python"])),
    ("accelerator", "accelerator", lambda r: (r["accelerator"], version_key(r["cuda"]))),
    ("flavor", "flavor", lambda r: r["flavor"] or ""),
    ("driver", "min driver", lambda r: version_key(r["min_driver"])),
    ("platforms", "platforms", lambda r: r["platforms"]),
    ("size", "size", lambda r: r["size"] or 0),
    ("date", "last build", lambda r: r["date"] or ""),
)


def version_key(text: str | None) -> tuple[int, ...]:
    out = []
    for part in (text or "").replace("+", ".").split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def page_name(tag: str) -> str:
    return f"tags/{tag}.html"


def sort_page(key: str) -> str:
    return "index.html" if key == "tag" else f"index-by-{key}.html"


# ---- what the pages show ----------------------------------------------------------------------


def index_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per floating tag: what the chooser filters and the table shows."""
    rows = []
    for variant in doc["variants"]:
        image = doc["images"].get(variant["digest"] or "")
        if image is None:
            continue
        first = image["platforms"][0] if image["platforms"] else {}
        smoke = (first.get("evidence") or {}).get("smoke") or {}
        verdict = howto.smoke_verdict(smoke, image["accelerator"])
        last = variant["history"][-1] if variant["history"] else {}
        rows.append({
            "tag": variant["tag"], "href": page_name(variant["tag"]),
            "dated": last.get("tag"), "date": last.get("date"),
            "torch": image["torch"], "python": image["python"],
            "accelerator": image["accelerator"], "cuda": image["cuda"],
            "flavor": image["flavor"], "min_driver": image["min_driver"],
            "archs": " ".join(image["cuda_archs"]),
            "platforms": " ".join(p["platform"] for p in image["platforms"]),
            "size": first.get("size"), "smoke": verdict,
            "signature": signature_line(image["signature"]),
            "audit": audit_line(first.get("audit") or {}),
        })
    return rows


def signature_line(sig: dict[str, Any]) -> tuple[str, str]:
    """(the index's signature cell, its css class)."""
    if not sig.get("present"):
        return "not signed", "fail"
    if sig.get("verified"):
        return "signed, verified", "pass"
    if sig.get("verified") is False:
        return "does not verify", "fail"
    return "signed" + (" (keyless)" if sig.get("keyless") else "") + ", not verified here", ""


def audit_line(audit: dict[str, Any]) -> tuple[str, str]:
    """(the latest audit in a few words, its css class): the same answer as the history's."""
    state, date = audit.get("state") or "not audited", audit.get("date")
    when = f" ({date})" if date else ""
    if state == "vulnerable":
        return f"{audit['vulnerabilities']} known vulnerabilities{when}", "fail"
    if state == "clean":
        return f"0 known vulnerabilities{when}", "pass"
    if state == "inconclusive":
        return f"not conclusive{when}: {', '.join(audit.get('incomplete') or [])} not asked", \
            "standin"
    return "not audited", ""


def siblings(doc: dict[str, Any], image: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(floating tag, image) of the same torch/python/accelerator in every flavor, this one
    included, for the layer chart and the shared bytes."""
    same = ("torch", "python", "accelerator", "cuda")
    found = []
    for variant in doc["variants"]:
        other = doc["images"].get(variant["digest"] or "")
        if other and variant["floating"] and all(other[k] == image[k] for k in same):
            found.append((variant["tag"], other))
    return sorted(found, key=lambda pair: GROUP_ORDER.get(pair[1]["flavor"], 9))


GROUP_ORDER = {"slim": 0, "runtime": 1, "devel": 2}


def shared_bytes(image: dict[str, Any], other: dict[str, Any]) -> int:
    """Compressed bytes of the layers two images (their first platforms) have in common."""
    if not image["platforms"] or not other["platforms"]:
        return 0
    return layer_reuse.shared_bytes(image["platforms"][0]["layers"],
                                    other["platforms"][0]["layers"])


def group_sizes(platform: dict[str, Any]) -> dict[str, int]:
    sizes = dict.fromkeys(GROUPS, 0)
    for layer in platform["layers"]:
        sizes[layer["group"]] += layer["size"]
    return sizes


# ---- charts -----------------------------------------------------------------------------------


def layer_chart(rows: list[tuple[str, dict[str, int]]], width: int = 640) -> Markup:
    """Stacked bars, one per flavor, a segment per layer group (compressed bytes)."""
    bar_h, gap, label_w, top = 22, 10, 150, 24
    biggest = max([sum(sizes.values()) for _, sizes in rows] + [1])
    scale = (width - label_w - 90) / biggest
    height = top + len(rows) * (bar_h + gap) + 10
    parts = [_legend(width)]
    for i, (label, sizes) in enumerate(rows):
        y = top + i * (bar_h + gap)
        parts.append(f'<text x="0" y="{y + 15}" class="label">{escape(label)}</text>')
        x = float(label_w)
        for group in GROUPS:
            w = sizes.get(group, 0) * scale
            if w > 0:
                parts.append(f'<rect x="{x:.1f}" y="{y}" width="{max(w, 1):.1f}" '
                             f'height="{bar_h}" class="g-{group}"><title>{group}: '
                             f'{human_bytes(sizes[group])}</title></rect>')
                x += w
        parts.append(f'<text x="{x + 6:.1f}" y="{y + 15}" class="label">'
                     f'{human_bytes(sum(sizes.values()))}</text>')
    return _svg(width, height, "Compressed size per layer group, per flavor", parts)


def history_chart(entries: list[dict[str, Any]], width: int = 640) -> Markup:
    """One bar per dated build (compressed size), its vulnerability count above it."""
    height, top, bottom = 170, 22, 40
    entries = entries[-24:]
    biggest = max([e["size"] or 0 for e in entries] + [1])
    slot = (width - 20) / max(len(entries), 1)
    bar_w = min(48.0, slot * 0.6)
    scale = (height - top - bottom) / biggest
    parts = []
    for i, entry in enumerate(entries):
        h = (entry["size"] or 0) * scale
        x = 10 + i * slot + (slot - bar_w) / 2
        y = height - bottom - h
        vulns = entry["vulnerabilities"]
        mark = entry.get("audit") or "not audited" if vulns is None else f"{vulns} vuln."
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{max(h, 1):.1f}"'
                     f' class="{"bar-vuln" if vulns else "bar"}"><title>{escape(entry["tag"])}:'
                     f' {human_bytes(entry["size"] or 0)}, {mark}</title></rect>')
        cx = x + bar_w / 2
        parts.append(f'<text x="{cx:.1f}" y="{y - 5:.1f}" class="label small" '
                     f'text-anchor="middle">{mark}</text>')
        parts.append(f'<text x="{cx:.1f}" y="{height - bottom + 14}" class="label small" '
                     f'text-anchor="middle">{escape(entry["date"])}</text>')
        parts.append(f'<text x="{cx:.1f}" y="{height - bottom + 28}" class="label small" '
                     f'text-anchor="middle">{human_bytes(entry["size"] or 0)}</text>')
    return _svg(width, height, "Size and vulnerabilities per dated build", parts)


def _legend(width: int) -> str:
    step = (width - 150) / len(GROUPS)
    return "".join(f'<rect x="{150 + i * step:.0f}" y="2" width="10" height="10" class="g-{g}"/>'
                   f'<text x="{150 + i * step + 14:.0f}" y="11" class="label small">{g}</text>'
                   for i, g in enumerate(GROUPS))


def _svg(width: int, height: int, title: str, parts: list[str]) -> Markup:
    return Markup(f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" '
                  f'viewBox="0 0 {width} {height}" width="{width}" height="{height}">'
                  f'<title>{escape(title)}</title>{"".join(parts)}</svg>')


# ---- writing the site -------------------------------------------------------------------------


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ASSETS), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    env.filters["bytes"] = lambda n: "unknown" if n is None else human_bytes(n)
    env.filters["short"] = lambda d: (d or "")[:19]
    env.globals.update(page_name=page_name, howto=howto, audit_line=audit_line,
                       counted=COUNTED, change_line=change_line,
                       unreadable=lambda ev: f" (unreadable: {ev['error']})" if "error" in ev
                       else "")
    return env


def assets_stamp() -> str:
    """What the pages are made with besides the facts: the templates and this version."""
    digest = hashlib.sha256(__version__.encode())
    for path in sorted(ASSETS.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def write_site(doc: dict[str, Any], out: Path, *, same_facts: bool = False) -> int:
    """Write every page (unchanged files are left alone); returns how many were written.
    `same_facts`: the site in `out` was made from these facts; when it was also made with
    these templates (its stamp) and nothing is missing, nothing is rendered at all."""
    stamp_file = out / ".cache" / "site.sha256"
    stamp = assets_stamp()
    if same_facts and (out / "index.html").is_file() and stamp_file.is_file() \
            and stamp_file.read_text() == stamp:
        return 0
    env = environment()
    files: dict[str, str] = {"catalog.json": json.dumps(doc, indent=1, sort_keys=True) + "\n"}
    files |= {name: (ASSETS / name).read_text() for name in COPIED}
    files |= {key["href"]: key["pem"] for key in doc.get("public_keys") or []}
    rows = index_rows(doc)
    counts = howto.smoke_counts([r["smoke"] for r in rows])
    columns = [(key, heading, sort_page(key)) for key, heading, _ in COLUMNS]
    for key, _, sort in COLUMNS:
        files[sort_page(key)] = env.get_template("index.html.j2").render(
            doc=doc, rows=sorted(rows, key=sort), columns=columns, sorted_by=key, root="",
            counts=counts)
    for variant in doc["variants"]:
        files |= tag_pages(env, doc, variant)
    written = 0
    for name, text in files.items():
        target = out / name
        if not target.exists() or target.read_text() != text:
            state.atomic_write(target, text)
            written += 1
    state.atomic_write(stamp_file, stamp)
    return written


def tag_pages(env: jinja2.Environment, doc: dict[str, Any],
              variant: dict[str, Any]) -> dict[str, str]:
    """The floating tag's page, and one per dated tag of its history."""
    template = env.get_template("image.html.j2")
    pages = {}
    entries = [(variant["tag"], variant["digest"], None)] if variant["floating"] else []
    entries += [(e["tag"], e["digest"], e) for e in variant["history"]]
    chart = history_chart(variant["history"]) if variant["history"] else None
    for tag, digest, entry in entries:
        image = doc["images"][digest]
        family = siblings(doc, image)
        if not any(other is image for _, other in family):  # a dated build no longer floating
            family = [(tag, image), *[(n, o) for n, o in family if o["flavor"] != image["flavor"]]]
        layers = layer_chart([(f"{other['flavor']}" + (" (this)" if other is image else ""),
                               group_sizes(other["platforms"][0]))
                              for _, other in family if other["platforms"]])
        reference = f"{doc['registry']}/{doc['repository']}@{digest}"
        twin = twin_of(doc, variant, digest, entry)
        pages[page_name(tag)] = template.render(
            doc=doc, variant=variant, tag=tag, image=image, entry=entry, root="../",
            reference=reference, **usage(doc, image, reference, twin),
            shared=[(name, other["flavor"], shared_bytes(image, other))
                    for name, other in family if other is not image],
            kept=layer_reuse.rows_for(variant, digest, entry),
            layer_chart=layers, history_chart=chart)
    return pages


def twin_of(doc: dict[str, Any], variant: dict[str, Any], digest: str,
            entry: dict[str, Any] | None = None) -> str | None:
    """The `-zstd` twin of the page's digest, by digest (what a pod should pin): a dated
    build's own twin, else the variant's for its current digest; None without a twin."""
    twin = (entry or {}).get("zstd") or (
        variant.get("zstd") if digest == variant.get("digest") else None)
    return f"{doc['registry']}/{doc['repository']}@{twin['digest']}" if twin else None


def usage(doc: dict[str, Any], image: dict[str, Any], reference: str,
          twin: str | None = None) -> dict[str, Any]:
    """How to run and verify the image, and its specifications (catalog_page's answers)."""
    keys = doc.get("public_keys") or []
    first = image["platforms"][0] if image["platforms"] else {}
    return {"keys": keys,
            "run": howto.run_commands(image, reference),
            "pod": howto.pod_manifest(image, reference, first.get("config") or {}, twin),
            "specs": howto.specifications(image, first),
            "verify": howto.verify_commands(reference, image["signature"],
                                            keys[0]["name"] if keys else "cosign.pub",
                                            image.get("source"))}
