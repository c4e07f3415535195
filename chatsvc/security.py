"""Password and token hashing.  Passwords get scrypt (slow on purpose); API keys and login tokens are random,
so sha256."""

import base64
import functools
import hashlib
import hmac
import secrets

SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
API_KEY_PREFIX = "kvc-"


def hash_password(password: str) -> str:
    if not password:
        raise ValueError("the password is empty")
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P)
    return "$".join(["scrypt", str(SCRYPT_N), str(SCRYPT_R), str(SCRYPT_P), _b64(salt), _b64(digest)])


def verify_password(password: str, stored: str) -> bool:
    scheme, n, r, p, salt, digest = stored.split("$")
    if scheme != "scrypt":
        raise ValueError(f"unknown password hash scheme {scheme!r}")
    computed = hashlib.scrypt(password.encode(), salt=_unb64(salt), n=int(n), r=int(r), p=int(p))
    return hmac.compare_digest(computed, _unb64(digest))


@functools.cache
def decoy_password_hash() -> str:
    """What an unknown user's password is checked against, so that the check costs the same."""
    return hash_password(secrets.token_urlsafe(16))


def new_api_key() -> str:
    return API_KEY_PREFIX + secrets.token_urlsafe(32)


def new_login_token() -> str:
    return secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)
