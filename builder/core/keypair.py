"""cosign key pairs and the trust of a run. `cosign.key` is a PKCS#8 ECDSA P-256 key encrypted
with nacl/secretbox under a scrypt key, base64 JSON in an `ENCRYPTED SIGSTORE PRIVATE KEY` PEM;
`cosign.pub` is a PKIX `PUBLIC KEY` PEM. `cryptography` does the key and ECDSA work, `pynacl` the
secretbox. The envelope around them is cosign's own and no library writes it, so it is written
here. Signatures made with these keys are `builder.core.sign`.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import json
import os
import re
import secrets
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import nacl.exceptions
import nacl.secret
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from builder.core.errors import BuilderError

PRIVATE_PEM = "ENCRYPTED SIGSTORE PRIVATE KEY"
PRIVATE_PEMS = (PRIVATE_PEM, "ENCRYPTED COSIGN PRIVATE KEY")  # cosign 1.x wrote the second
SCRYPT = {"N": 32768, "r": 8, "p": 1}


@dataclass(frozen=True)
class SigningKey:
    private: ec.EllipticCurvePrivateKey

    @property
    def public(self) -> ec.EllipticCurvePublicKey:
        return self.private.public_key()

    def sign(self, data: bytes) -> bytes:
        """cosign's signature: ECDSA P-256 over SHA-256, ASN.1 DER."""
        return self.private.sign(data, ec.ECDSA(hashes.SHA256()))


def _scrypt(password: bytes, salt: bytes, params: dict[str, int]) -> bytes:
    return hashlib.scrypt(password, salt=salt, n=params["N"], r=params["r"], p=params["p"],
                          maxmem=128 * params["N"] * params["r"] * 2, dklen=32)


def _pem(label: str, body: bytes) -> bytes:
    lines = [base64.b64encode(body)[i:i + 64] for i in range(0, len(base64.b64encode(body)), 64)]
    return b"\n".join([f"-----BEGIN {label}-----".encode(), *lines,
                       f"-----END {label}-----".encode()]) + b"\n"


def encrypt_private(key: ec.EllipticCurvePrivateKey, password: bytes) -> bytes:
    """The `cosign.key` bytes of `key`."""
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    salt, nonce = secrets.token_bytes(32), secrets.token_bytes(24)
    box = nacl.secret.SecretBox(_scrypt(password, salt, SCRYPT))
    doc = {"kdf": {"name": "scrypt", "params": SCRYPT, "salt": base64.b64encode(salt).decode()},
           "cipher": {"name": "nacl/secretbox", "nonce": base64.b64encode(nonce).decode()},
           "ciphertext": base64.b64encode(box.encrypt(der, nonce).ciphertext).decode()}
    return _pem(PRIVATE_PEM, json.dumps(doc).encode())


def decrypt_private(pem: bytes, where: str, secret: bytes | None = None) -> SigningKey:
    """A `cosign.key` (`where` names it in errors); the password is asked for (password())
    only once the file is known to be a cosign key."""
    text = pem.decode(errors="replace").strip()
    label = next((x for x in PRIVATE_PEMS if text.startswith(f"-----BEGIN {x}-----")), None)
    if label is None:
        raise BuilderError(f"{where}: not a cosign private key (no `BEGIN {PRIVATE_PEM}`)",
                          hint="make one with `builder keygen` or `cosign generate-key-pair`")
    body = "".join(line for line in text.splitlines() if not line.startswith("-----"))
    try:
        doc = json.loads(base64.b64decode(body))
        kdf, cipher = doc["kdf"], doc["cipher"]
        if kdf["name"] != "scrypt" or cipher["name"] != "nacl/secretbox":
            raise ValueError(f"unsupported {kdf['name']} / {cipher['name']}")
        salt = base64.b64decode(kdf["salt"])
    except (ValueError, KeyError, TypeError) as exc:
        raise BuilderError(f"{where}: not a cosign private key: {exc}") from None
    try:
        box_key = _scrypt(password() if secret is None else secret, salt, kdf["params"])
        der = nacl.secret.SecretBox(box_key).decrypt(base64.b64decode(doc["ciphertext"]),
                                                     base64.b64decode(cipher["nonce"]))
    except nacl.exceptions.CryptoError:
        raise BuilderError(f"{where}: wrong password (COSIGN_PASSWORD)") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise BuilderError(f"{where}: not a cosign private key: {exc}") from None
    key = serialization.load_der_private_key(der, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise BuilderError(f"{where}: not an ECDSA key")
    return SigningKey(key)


def public_pem(key: ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM,
                            serialization.PublicFormat.SubjectPublicKeyInfo)


def load_public(path: Path) -> ec.EllipticCurvePublicKey:
    """A `cosign.pub` (PKIX PEM, ECDSA)."""
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except OSError as exc:
        raise BuilderError(f"{path}: cannot read the public key: {exc.strerror}") from None
    except ValueError:
        raise BuilderError(f"{path}: not a PEM public key (cosign.pub)") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise BuilderError(f"{path}: not an ECDSA public key")
    return key


def password(confirm: bool = False) -> bytes:
    """COSIGN_PASSWORD (cosign's variable; may be empty), else a prompt on the terminal."""
    if "COSIGN_PASSWORD" in os.environ:
        return os.environ["COSIGN_PASSWORD"].encode()
    if not sys.stdin.isatty():
        raise BuilderError("no password: set COSIGN_PASSWORD (may be empty)")
    try:
        first = getpass.getpass("Enter password for private key: ")
        if confirm and getpass.getpass("Enter password for private key again: ") != first:
            raise BuilderError("the passwords differ")
    except EOFError:
        raise BuilderError("no password: set COSIGN_PASSWORD (may be empty)") from None
    return first.encode()


def keygen(folder: Path) -> tuple[Path, Path]:
    """Write `cosign.key` (mode 600) and `cosign.pub` into `folder`; never overwrites, never
    writes through a symlink (a planted `cosign.pub` link would put the key's public half, or
    a later overwrite, somewhere else), and every file error is one BuilderError."""
    key_path, pub_path = folder / "cosign.key", folder / "cosign.pub"
    if not folder.is_dir():
        raise BuilderError(f"{folder}: no such folder: the key pair is not written",
                           hint=f"create it first (`mkdir -p {folder}`) or give --out an "
                           "existing folder")
    for path in (key_path, pub_path):
        if path.is_symlink():
            raise BuilderError(f"{path} is a symlink: keygen never writes through one",
                               hint="remove the link, or give --out another folder")
        if path.exists():
            raise BuilderError(f"{path} exists: not overwritten",
                               hint="move it away first, or use it (--key)")
    key = ec.generate_private_key(ec.SECP256R1())
    pem = encrypt_private(key, password(confirm=True))
    _write_new(key_path, pem, 0o600)
    try:
        _write_new(pub_path, public_pem(key.public_key()), 0o644)
    except BuilderError:
        key_path.unlink(missing_ok=True)  # no half pair left behind
        raise
    return key_path, pub_path


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create `path` (O_EXCL: never an existing file, never through a symlink) and write it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    except OSError as exc:
        raise BuilderError(f"{path}: cannot write the key file: {exc.strerror}",
                           hint="check that the folder is writable and holds no file or link "
                           "of that name") from None


def signing_key(path: Path | str | None) -> SigningKey | None:
    """The key of `--key FILE`, else of COSIGN_PRIVATE_KEY (the PEM text, as cosign's
    `env://COSIGN_PRIVATE_KEY`), else None (nothing to sign with)."""
    if path:
        try:
            pem = Path(path).read_bytes()
        except OSError as exc:
            raise BuilderError(f"{path}: cannot read the signing key: {exc.strerror}") from None
        return decrypt_private(pem, str(path))
    if os.environ.get("COSIGN_PRIVATE_KEY"):
        return decrypt_private(os.environ["COSIGN_PRIVATE_KEY"].encode(),
                               "COSIGN_PRIVATE_KEY")
    return None


@dataclass(frozen=True)
class Identity:
    """Who may sign keylessly (builder.core.keyless): an OIDC issuer and the certificate's
    subject, exact or a full-match regular expression (cosign's --certificate-identity[-regexp]
    and --certificate-oidc-issuer)."""

    issuer: str
    identity: str = ""
    regexp: str = ""

    def __post_init__(self) -> None:
        if bool(self.identity) == bool(self.regexp):
            raise BuilderError("an identity needs exactly one of --certificate-identity and "
                               "--certificate-identity-regexp",
                               hint="e.g. --certificate-identity https://github.com/O/R/.github/"
                               "workflows/build.yml@refs/heads/main")
        if self.regexp:
            try:
                re.compile(self.regexp)
            except re.error as exc:
                raise BuilderError(f"--certificate-identity-regexp `{self.regexp}`: {exc}") \
                    from None

    def matches(self, subject: str) -> bool:
        return subject == self.identity if self.identity else bool(
            re.fullmatch(self.regexp, subject))

    def describe(self) -> str:
        return f"{self.identity or '~' + self.regexp} ({self.issuer})"


@dataclass(frozen=True)
class Vouchers:
    """Who may vouch for bytes read back from a registry: trusted keys (cosign's `.sig`/`.att`)
    and trusted workflow identities (sigstore bundles whose certificates chain to
    `trusted_root`, None: sigstore's public good). Either is enough; none trusts nothing.
    `builder.core.vouch` asks them."""

    keys: tuple[ec.EllipticCurvePublicKey, ...] = ()
    identities: tuple[Identity, ...] = ()
    trusted_root: Path | None = None

    def __bool__(self) -> bool:
        return bool(self.keys or self.identities)


NOBODY = Vouchers()  # no key, no identity: nothing read back is vouched for


@dataclass(frozen=True)
class KeylessSigner:
    """What keyless signing needs: the OIDC token (its identity goes into a short-lived Fulcio
    certificate) and sigstore's client trust config (None: the public good)."""

    token: str
    config: Path | None = None


@dataclass(frozen=True, kw_only=True)
class Trust:
    """What `publish` signs with (a key, an OIDC token, both), and who staged evidence and the
    registry's publications must be vouched for by."""

    key: SigningKey | None = None
    vouchers: Vouchers = field(default_factory=Vouchers)
    unsigned: bool = False  # --unsigned: nothing verified, so nothing signed (recorded)
    keyless: KeylessSigner | None = None

    @property
    def signs(self) -> bool:
        return self.key is not None or self.keyless is not None


UNSIGNED = Trust(unsigned=True)


def trust(key_path: Path | str | None, vouched: Vouchers, unsigned: bool,
          keyless: KeylessSigner | None = None) -> Trust:
    """The Trust of `--key`/COSIGN_PRIVATE_KEY, an OIDC token (`keyless`), who vouches
    (`vouched`: --trust-key and identities; no key in it: the signing key's own public key)
    and `--unsigned`. Signing with --unsigned is refused: a signature would vouch for evidence
    nobody verified (a forged staging image would come out signed)."""
    key = signing_key(key_path)
    if (key is not None or keyless is not None) and unsigned:
        raise BuilderError("--unsigned with a signing key: publish never signs what it has "
                           "not verified, and --unsigned skips that check",
                           hint="drop --unsigned to sign what verifies against --trust-key, or "
                           "drop --key (and COSIGN_PRIVATE_KEY, SIGSTORE_ID_TOKEN) to publish "
                           "without any signature")
    if key is None and keyless is None and not unsigned:
        raise BuilderError("no signing key: publish signs every digest it promotes",
                          hint="give --key cosign.key (or COSIGN_PRIVATE_KEY and "
                          "COSIGN_PASSWORD; `builder keygen` makes a pair), an OIDC token "
                          "(--identity-token, SIGSTORE_ID_TOKEN), or --unsigned to publish "
                          "without signatures (recorded in published.json)")
    keys = vouched.keys or ((key.public,) if key else ())
    return Trust(key=key, vouchers=Vouchers(keys, vouched.identities, vouched.trusted_root),
                 unsigned=unsigned, keyless=keyless)


def trusted_keys(paths: Iterable[Path], key: SigningKey | None
                 ) -> tuple[ec.EllipticCurvePublicKey, ...]:
    """The public keys in `paths` (--trust-key, the matrix's `trust.keys`), else the signing
    key's own public key, else none."""
    return tuple(load_public(Path(p)) for p in paths) or ((key.public,) if key else ())


def key_id(key: ec.EllipticCurvePublicKey) -> str:
    """A short name for a public key in messages: sha256 of its DER, 12 hex digits."""
    der = key.public_bytes(serialization.Encoding.DER,
                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()[:12]


def verifies(keys: Iterable[ec.EllipticCurvePublicKey], data: bytes, signature: bytes) -> bool:
    for key in keys:
        try:
            key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
            return True
        except InvalidSignature:
            continue
    return False
