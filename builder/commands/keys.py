"""`builder keygen`: a cosign-format key pair for signing; the work is `builder.core.sign`."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.commands.options import add_command
from builder.core import keypair
from builder.core.output import emit_json, step


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "keygen", cmd_keygen, ("matrix", "json"),
                    "write a cosign key pair (cosign.key, cosign.pub)")
    p.add_argument("--out", type=Path, default=Path("."), metavar="DIR",
                   help="folder to write the pair into (default: the current folder)")


def cmd_keygen(args: argparse.Namespace) -> int:
    """Write `cosign.key` (ECDSA P-256, encrypted: scrypt + nacl/secretbox, as `cosign
    generate-key-pair` writes it; mode 600) and `cosign.pub` into the current folder (or
    --out). The password comes from COSIGN_PASSWORD (may be empty) or a prompt. Sign with
    `--key cosign.key` or COSIGN_PRIVATE_KEY=<its text>; verify with `builder verify --key
    cosign.pub REF` or `cosign verify --key cosign.pub --insecure-ignore-tlog=true REF` (an
    offline key signature has no Rekor entry). Never overwrites a file, never writes through a
    symlink."""
    key_path, pub_path = keypair.keygen(args.out)
    if args.json:
        emit_json({"private_key": str(key_path), "public_key": str(pub_path)})
    else:
        step(f"Private key written to {key_path}")
        step(f"Public key written to {pub_path}")
    return 0
