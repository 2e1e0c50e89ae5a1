"""A package index's project page, as a `find_links` URL names one: its files' names, URLs and
sha256 (PEP 691 JSON when served, else the PEP 503 HTML anchors the PyTorch index serves), and
the download of one file checked against its hash.

Written here rather than taken from pip or uv, whose page readers are not libraries; the HTML
is read with the standard library's parser.
"""

from __future__ import annotations

import hashlib
import json
import os
import ssl
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from builder.core import settings
from builder.core.errors import BuilderError

ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str  # absolute, without its #fragment
    sha256: str | None  # from the page (`#sha256=` or the JSON hashes), when it gives one

    @property
    def pin(self) -> tuple[str, str] | None:
        """The wheel's (normalized name, version), as a lock pins it; None for anything else."""
        try:
            name, version, *_ = parse_wheel_filename(self.filename)
        except InvalidWheelFilename:
            return None
        return str(name), str(version)


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def open_url(url: str, timeout: float, accept: str = ACCEPT) -> Any:
    """A GET with the host's CA bundle (the response: a context manager, read in chunks)."""
    request = urllib.request.Request(url, headers={"Accept": accept})
    context = ssl.create_default_context(cafile=settings.current().host_ca_bundle())
    return urllib.request.urlopen(request, timeout=timeout, context=context)


def project_files(url: str, timeout: float = 20.0) -> list[IndexFile]:
    """The files a project page lists; BuilderError naming the URL when it cannot be read."""
    try:
        with open_url(url, timeout) as response:
            body = response.read().decode()
    except (OSError, ValueError) as exc:
        raise BuilderError(f"cannot read the wheel page {url}: {exc}",
                           hint="a machine that cannot reach it sets "
                           f"${settings.WHEEL_MIRROR_ENV} to a folder holding the wheels") from None
    if body.lstrip().startswith("{"):
        return [IndexFile(f["filename"], urllib.parse.urljoin(url, f["url"]).split("#")[0],
                          (f.get("hashes") or {}).get("sha256"))
                for f in json.loads(body).get("files", [])]
    parser = _Anchors()
    parser.feed(body)
    return [_from_href(url, href) for href in parser.hrefs]


def _from_href(page: str, href: str) -> IndexFile:
    absolute, _, fragment = urllib.parse.urljoin(page, href).partition("#")
    name = urllib.parse.unquote(absolute.rsplit("/", 1)[-1])
    algorithm, _, value = fragment.partition("=")
    return IndexFile(name, absolute, value if algorithm == "sha256" and value else None)


def download(file: IndexFile, folder: Path, accepted: set[str], timeout: float = 600.0) -> str:
    """Stream `file` into `folder` under its name, and return its sha256; BuilderError, and
    nothing left, when its bytes hash to none of `accepted` (the lock's hashes)."""
    if Path(file.filename).name != file.filename or file.filename.startswith("."):
        raise BuilderError(f"{file.url}: the page names the file `{file.filename[:80]}`, "
                           "not a plain file name: refused")
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".download-")
    try:
        with os.fdopen(fd, "wb") as out, open_url(file.url, timeout, "*/*") as response:
            for chunk in iter(lambda: response.read(1 << 20), b""):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() not in accepted:
            raise BuilderError(f"{file.url}: its bytes hash to sha256:{digest.hexdigest()[:12]}…, "
                               "which the lock does not name: refused",
                               hint="the page serves other bytes than the lock was made "
                               "from: re-lock (`builder lock`) only if that is expected")
        os.chmod(tmp, 0o644)  # mkstemp's 0600: the build reads it as another user
        os.replace(tmp, folder / file.filename)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return digest.hexdigest()
