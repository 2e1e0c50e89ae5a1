"""The option groups commands share (each command takes only those it uses), the run's
settings resolved once from them, and the selection: the CLI layer's own helpers (command
modules import this, never `builder.cli` or each other)."""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from builder.core import keyless, keypair
from builder.core.errors import ConfigError
from builder.core.settings import CA_BUNDLE_ENV, Settings
from builder.model import matrix

SHARED = ("matrix", "select", "json", "registries", "locks")  # groups a command may take
# Another sigstore instance than the public good, for a whole machine (the workflow
# rehearsal's mock services on loopback, set in its runner's environment): the defaults of
# --sigstore-config and --trusted-root. GitHub's runners set neither, so CI signs through the
# public good and verifies against its pinned root.
SIGSTORE_CONFIG_ENV, TRUSTED_ROOT_ENV = "BUILDER_SIGSTORE_CONFIG", "BUILDER_TRUSTED_ROOT"


def add_command(sub: argparse._SubParsersAction, name: str, func: Callable[..., int],
                shared: Iterable[str], summary: str, **parser: Any) -> argparse.ArgumentParser:
    """A command's parser: `func` handles it and its docstring is the --help description;
    it takes those of the shared option groups it uses (`SHARED`), so its --help lists nothing
    it ignores, but for `matrix` and `json`, which every command takes (the README says so: a
    script may pass them to any command)."""
    parser.setdefault("description", inspect.getdoc(func))
    p = sub.add_parser(name, help=summary, **parser)
    for group in shared:
        _ADD[group](p)
    p.set_defaults(func=func)
    return p


def _add_matrix(p: argparse.ArgumentParser) -> None:
    p.add_argument("--matrix", default=os.environ.get("BUILDER_MATRIX", "matrix.yaml"),
                   metavar="FILE", help="the version matrix (default: %(default)s)")


def _add_select(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--select", action="append", default=[], metavar="KEY=VALUE",
        help="only variants whose KEY equals VALUE (repeatable: different keys must all match, "
        "a repeated key matches any of its values), e.g. --select flavor=slim --select "
        "flavor=runtime --select python=3.11 (slim or runtime, on 3.11); KEY is torch, python, "
        "accelerator, flavor, platform, id or default (default=true picks the matrix's default "
        "selection)",
    )


def _add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")


def _add_registries(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--insecure-registry", action="append", default=[], metavar="HOST[:PORT]|CIDR",
        help="a registry that may answer over plain HTTP when HTTPS fails, as Docker's "
        "insecure-registries (repeatable; 127.0.0.0/8 always is; the matrix's "
        "`insecure_registries` and $BUILDER_INSECURE_REGISTRIES add more)",
    )


def _add_locks(p: argparse.ArgumentParser) -> None:
    p.add_argument("--locks", default=Path("locks"), type=Path, metavar="DIR",
                   help="the lock folder (default: locks)")


_ADD = {"matrix": _add_matrix, "select": _add_select, "json": _add_json,
        "registries": _add_registries, "locks": _add_locks}


def resolve(args: argparse.Namespace) -> Settings:
    """The run's settings, made once from the parsed arguments, the matrix's
    `insecure_registries` and the environment (the command line wins), before the command
    runs; nothing changes them afterwards."""
    from_env = Settings.from_env()
    insecure = [*from_env.insecure_registries, *getattr(args, "insecure_registry", [])]
    if (path := getattr(args, "matrix", None)) is not None:
        insecure += matrix.declared_insecure_registries(path)
    ca_bundle = getattr(args, "ca_bundle", None)
    return replace(from_env, insecure_registries=tuple(dict.fromkeys(insecure)),
                   ca_bundle=str(ca_bundle) if ca_bundle else from_env.ca_bundle)


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
                        default=os.environ.get(CA_BUNDLE_ENV))


def add_key_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--key", type=Path, metavar="FILE",
                        help=f"cosign private key that signs {what} (default: the PEM in "
                        "COSIGN_PRIVATE_KEY, if set; password: COSIGN_PASSWORD or a prompt)")


def add_publishing_options(parser: argparse.ArgumentParser, dry_run: str) -> None:
    """What the commands that publish (publish, rebuild) share: the report, the CPU-smoke
    waiver, the dry run (`dry_run`: what it does) and the keys."""
    add_report_option(parser)
    parser.add_argument("--allow-cpu-smoke", action="store_true",
                        help="publish CUDA images whose smoke ran without a GPU (recorded)")
    parser.add_argument("--dry-run", action="store_true", help=dry_run)
    add_trust_options(parser)


def add_trust_options(parser: argparse.ArgumentParser) -> None:
    """--key, --trust-key, the identities and --unsigned of the commands that publish."""
    add_key_option(parser, "each promoted digest (cosign `.sig`) and its attestations (`.att`)")
    parser.add_argument("--trust-key", action="append", type=Path, default=[], metavar="FILE",
                        help="public key (cosign.pub) that staged evidence must be signed by "
                        "(repeatable; default: the matrix's `trust.keys`, else the signing "
                        "key's own public key)")
    add_identity_options(parser, "staged evidence and the registry's publications",
                         "the matrix's `trust.identities`")
    parser.add_argument("--unsigned", action="store_true",
                        help="publish without any signature: staged evidence is not checked "
                        "against a trusted key, so nothing is signed (no `.sig`, no signed "
                        "attestations; recorded in the provenance and a --manifest report; `verify "
                        "--key` fails it as `published unsigned`). Refused with a key")


def add_identity_options(p: argparse.ArgumentParser, what: str, default: str) -> None:
    """cosign's --certificate-identity[-regexp], --certificate-oidc-issuer and --trusted-root:
    who may sign `what` keylessly (`default`: what counts without them)."""
    p.add_argument("--certificate-identity", action="append", default=[], metavar="URI",
                   help=f"trusted keyless (sigstore bundle) signer of {what}, e.g. "
                   "https://github.com/O/R/.github/workflows/build.yml@refs/heads/main "
                   f"(repeatable; default: {default})")
    p.add_argument("--certificate-identity-regexp", action="append", default=[],
                   metavar="REGEX", help="as --certificate-identity, a full-match regexp")
    p.add_argument("--certificate-oidc-issuer", metavar="URL",
                   help=f"the identities' OIDC issuer (GitHub Actions: {keyless.GITHUB_ISSUER})")
    p.add_argument("--trusted-root", type=Path, metavar="FILE",
                   help="sigstore trusted_root.json the certificates and log entries must chain "
                   f"to (default: ${TRUSTED_ROOT_ENV}, else the matrix's `trust.trusted_root`, "
                   "else sigstore's public good, pinned in builder/trust/)")


def trusted_root(args: argparse.Namespace) -> Path | None:
    """--trusted-root, else $BUILDER_TRUSTED_ROOT; None: the matrix's, else the public good."""
    chosen = args.trusted_root or os.environ.get(TRUSTED_ROOT_ENV)
    return Path(chosen) if chosen else None


def sigstore_config(args: argparse.Namespace) -> Path | None:
    """--sigstore-config, else $BUILDER_SIGSTORE_CONFIG; None: the public good."""
    chosen = args.sigstore_config or os.environ.get(SIGSTORE_CONFIG_ENV)
    return Path(chosen) if chosen else None


def identities(args: argparse.Namespace) -> tuple[keyless.Identity, ...]:
    """The identities the command line names (each under its --certificate-oidc-issuer)."""
    return keyless.identities_of(args.certificate_identity, args.certificate_identity_regexp,
                                 args.certificate_oidc_issuer)


def vouchers(args: argparse.Namespace, m: matrix.Matrix | None) -> keypair.Vouchers:
    """Who signatures read back must be made by: --trust-key, else the matrix's `trust.keys`;
    the identity options, else the matrix's `trust.identities`; --trusted-root (or
    $BUILDER_TRUSTED_ROOT), else the matrix's. Each half defaults on its own, so a command
    line naming an identity keeps the matrix's keys."""
    configured = matrix_vouchers(m) if m is not None else keypair.NOBODY
    return keypair.Vouchers(
        keypair.trusted_keys(args.trust_key, None) or configured.keys,
        identities(args) or configured.identities, trusted_root(args) or configured.trusted_root)


def matrix_vouchers(m: matrix.Matrix) -> keypair.Vouchers:
    """The matrix's `trust:` (or `trust_keys:`), keys loaded."""
    named = tuple(keyless.Identity(x["issuer"], x.get("identity", ""),
                                   x.get("identity_regexp", "")) for x in m.trust_identities)
    return keypair.Vouchers(keypair.trusted_keys(m.trust_keys, None), named, m.trusted_root)


def keyless_signer(args: argparse.Namespace) -> keypair.KeylessSigner | None:
    """The OIDC token (--identity-token, else SIGSTORE_ID_TOKEN, else a GitHub Actions job's
    own, asked for when signing) and sigstore config to sign keylessly with; None without."""
    token = keyless.identity_token(args.identity_token, dict(os.environ))
    return None if token is None else keypair.KeylessSigner(token, sigstore_config(args))


def add_keyless_options(p: argparse.ArgumentParser) -> None:
    """The OIDC token and sigstore instance of keyless signing (attest, publish)."""
    p.add_argument("--identity-token", type=Path, metavar="FILE",
                   help="OIDC token to sign with (default: $SIGSTORE_ID_TOKEN; in a GitHub "
                   "Actions job with `id-token: write`, the job's token for audience `sigstore`, "
                   "asked for when signing)")
    p.add_argument("--sigstore-config", type=Path, metavar="FILE",
                   help="sigstore client trust config (trusted root + signing config: which "
                   f"Fulcio, Rekor, TSA); default: ${SIGSTORE_CONFIG_ENV}, else sigstore's "
                   "public-good instance")


def load_selected(args: argparse.Namespace) -> tuple[matrix.Matrix, list[matrix.Variant]]:
    """The matrix of --matrix and its variants that --select picks (at least one)."""
    m = matrix.load(args.matrix)
    variants = m.select(args.select)
    if not variants:
        raise ConfigError(f"--select {' '.join(args.select)} matches no variant in {args.matrix}",
                          hint=f"`builder validate --offline --matrix {args.matrix}` lists "
                          "its variants")
    return m, variants


def add_report_option(parser: argparse.ArgumentParser) -> None:
    """--manifest of the commands that publish: a report, never an input."""
    parser.add_argument("--manifest", default=None, type=Path, metavar="FILE",
                        help="write a report of each selected variant's publication, made now or "
                        "found already published (JSON, the published.json shape); the registry "
                        "itself is the publication record")


def ignore_old_record(manifest: Path | None) -> None:
    """One line when a published.json from before lies here: it is not read (the registry is
    the record), so it must not look like it was."""
    old = Path("published.json")
    if old.is_file() and (manifest is None or manifest.resolve() != old.resolve()):
        print(f"note: {old} is ignored: the registry is the publication record "
              "(`--manifest FILE` writes a report)", file=sys.stderr)
