"""What may be shown of a node's login key: its public half and fingerprint, never the private key itself."""

import base64
import hashlib

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from jobs.secret_box import open_secret


def fingerprint(public_line: str) -> str:
    """OpenSSH's SHA256 fingerprint of a public key line (`ssh-keygen -lf` prints the same)."""
    blob = base64.b64decode(public_line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def public_line_of(private_text: str) -> str:
    data = private_text.strip().encode()
    loader = (serialization.load_ssh_private_key if b"OPENSSH PRIVATE KEY" in data
              else serialization.load_pem_private_key)
    key = loader(data, password=None)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return public.decode()


def public_summary(sealed_private_key: str) -> str:
    """The public key and its fingerprint, for the back office; empty when no key is saved."""
    if not sealed_private_key:
        return ""
    try:
        public = public_line_of(open_secret(sealed_private_key))
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return "(a saved key that cannot be read: it was sealed with another SECRET_KEY, or is damaged)"
    return f"{public} ({fingerprint(public)})"
