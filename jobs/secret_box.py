"""Seals secrets (node and job private keys) before they reach the database, with keys derived from SECRET_KEY.

Sealing uses SECRET_KEY; opening tries it, then each of SECRET_KEY_FALLBACKS, so a rotated key does not
lock the console out of every node. `reseal` moves a sealed value onto the current key.
"""

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings


def _fernet_of(secret_key: str) -> Fernet:
    digest = hashlib.sha256(("training-console:node-secrets:" + secret_key).encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def _box() -> MultiFernet:
    return MultiFernet([_fernet_of(key) for key in [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]])


def seal_secret(plain: str) -> str:
    if not plain:
        return ""
    return _box().encrypt(plain.encode()).decode()


def open_secret(sealed: str) -> str:
    if not sealed:
        return ""
    try:
        return _box().decrypt(sealed.encode()).decode()
    except InvalidToken:
        raise ValueError("the stored secret cannot be opened: it was sealed with a SECRET_KEY that is neither "
                         "SECRET_KEY nor one of SECRET_KEY_FALLBACKS") from None


def reseal(sealed: str) -> str:
    """The same secret sealed with the current SECRET_KEY (ValueError when no key opens it)."""
    if not sealed:
        return ""
    try:
        return _box().rotate(sealed.encode()).decode()
    except InvalidToken:
        raise ValueError("the stored secret cannot be opened with SECRET_KEY or SECRET_KEY_FALLBACKS") from None
