"""The options every command shares, and the selection they all start from: the CLI layer's
own helpers (command modules import this, never `builder.cli` or each other)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from builder.core import proc
from builder.core.errors import ConfigError
from builder.model import matrix


def common_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--matrix", default=os.environ.get("BUILDER_MATRIX", "matrix.yaml"), metavar="FILE",
        help="the version matrix (default: %(default)s)",
    )
    common.add_argument(
        "--select", action="append", default=[], metavar="KEY=VALUE",
        help="only variants whose KEY equals VALUE (repeatable: different keys must all match, "
        "a repeated key matches any of its values), e.g. --select flavor=slim --select "
        "flavor=runtime --select python=3.11 (slim or runtime, on 3.11); KEY is torch, python, "
        "accelerator, flavor, platform, id or default (default=true picks the matrix's default "
        "selection)",
    )
    common.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    common.add_argument(
        "--insecure-registry", action="append", default=[], metavar="HOST[:PORT]|CIDR",
        help="a registry that may answer over plain HTTP when HTTPS fails, as Docker's "
        "insecure-registries (repeatable; 127.0.0.0/8 always is; the matrix's "
        "`insecure_registries` and $BUILDER_INSECURE_REGISTRIES add more)",
    )
    return common


def readable_file(text: str) -> Path:
    """argparse type: a file this user can read (checked now, not halfway through a build)."""
    path = Path(text)
    if not path.is_file() or not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text} is not a readable file")
    return path


REGISTRY_CA_HELP = ("CA bundle the registries' TLS certificates are checked against, beside the "
                    "system's and /etc/docker/certs.d/<host[:port]>/ca.crt (default: "
                    "$BUILDER_CA_BUNDLE, else the system bundle)")


def add_ca_bundle_option(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--ca-bundle", type=readable_file, metavar="FILE", help=help,
                        default=os.environ.get(proc.CA_BUNDLE_ENV) or proc.host_ca_bundle())


def add_locks_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--locks", default=Path("locks"), type=Path, metavar="DIR",
                        help="the lock folder (default: locks)")


def add_key_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--key", type=Path, metavar="FILE",
                        help=f"cosign private key that signs {what} (default: the PEM in "
                        "COSIGN_PRIVATE_KEY, if set; password: COSIGN_PASSWORD or a prompt)")


def add_trust_options(parser: argparse.ArgumentParser) -> None:
    """--key, --trust-key and --unsigned of the commands that publish."""
    add_key_option(parser, "each promoted digest (cosign `.sig`) and its attestations (`.att`)")
    parser.add_argument("--trust-key", action="append", type=Path, default=[], metavar="FILE",
                        help="public key (cosign.pub) that staged evidence must be signed by "
                        "(repeatable; default: the matrix's `trust_keys`, else the signing "
                        "key's own public key)")
    parser.add_argument("--unsigned", action="store_true",
                        help="promote staged evidence that no trusted key signed, and publish "
                        "without a signature when there is no key (recorded in published.json)")


def load_selected(args: argparse.Namespace) -> tuple[matrix.Matrix, list[matrix.Variant]]:
    """The matrix of --matrix and its variants that --select picks (at least one)."""
    m = matrix.load(args.matrix)
    variants = m.select(args.select)
    if not variants:
        raise ConfigError(f"--select {' '.join(args.select)} matches no variant in {args.matrix}")
    return m, variants
