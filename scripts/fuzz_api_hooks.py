"""Schemathesis hooks for scripts/fuzz-api.sh: every request is signed as docs/PROTOCOL.md §2.3
says, with a key of this run's own (through libsodium, already on the machine for the build), so
the fuzzer reaches the handlers behind authentication instead of stopping at 401."""

import base64
import ctypes
import ctypes.util
import hashlib
import json
import os
import time
from urllib.parse import unquote, urlsplit, parse_qsl

import requests
import schemathesis

_sodium = ctypes.CDLL(ctypes.util.find_library("sodium") or "libsodium.so.23")
if _sodium.sodium_init() < 0:
    raise RuntimeError("libsodium failed to initialise")

# One identity and key per run (scripts/fuzz-api.sh sets both, so its processes agree).
IDENTITY = os.environ.get("CONVKIT_FUZZ_IDENTITY", "fuzz-" + os.urandom(4).hex())
_public = ctypes.create_string_buffer(32)
_secret = ctypes.create_string_buffer(64)
_seed = bytes.fromhex(os.environ["CONVKIT_FUZZ_SEED"]) if "CONVKIT_FUZZ_SEED" in os.environ else os.urandom(32)
_sodium.crypto_sign_seed_keypair(_public, _secret, _seed)


def _percent_encode(text: str) -> str:
    unreserved = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"
    return "".join(chr(b) if b in unreserved else "%%%02X" % b for b in text.encode("utf-8"))


def _canonical_query(query: str) -> str:
    pairs = [(_percent_encode(k), _percent_encode(v)) for k, v in parse_qsl(query, keep_blank_values=True)]
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def _sign(message: bytes) -> bytes:
    signature = ctypes.create_string_buffer(64)
    _sodium.crypto_sign_detached(signature, None, message, ctypes.c_ulonglong(len(message)), _secret)
    return signature.raw


class ConvKitSignature(requests.auth.AuthBase):
    """Signs the prepared request: its final method, path, query and body bytes."""

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        # JSON bodies go out in the canonical form the server requires where records are signed
        # (sorted keys, no whitespace), so generated bodies reach the handlers' own checks.
        if "json" in (request.headers.get("Content-Type") or "") and request.body:
            try:
                value = json.loads(request.body)
            except ValueError:
                pass
            else:
                request.prepare_body(json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8"), None)
        body = request.body or b""
        if isinstance(body, str):
            body = body.encode("utf-8")
        url = urlsplit(request.url)
        identity = base64.b64encode(IDENTITY.encode()).decode()
        timestamp = str(int(time.time() * 1000))
        nonce = base64.b64encode(os.urandom(16)).decode()
        # The server signs over the path as it decodes it (§2.3).
        text = "\n".join([
            "convkit-request-v2", identity, request.method.upper(), unquote(url.path), _canonical_query(url.query),
            timestamp, nonce, hashlib.sha256(body).hexdigest(),
        ])
        signature = base64.b64encode(_sign(text.encode("utf-8"))).decode()
        key = base64.b64encode(_public.raw).decode()
        request.headers["Authorization"] = f"ConvKit-Ed25519 id={identity};key={key};ts={timestamp};nonce={nonce};sig={signature}"
        return request


def create_own_zone(base_url: str) -> None:
    answer = requests.put(f"{base_url}/v1/zones/{own_zone()}", auth=ConvKitSignature(), timeout=10)
    answer.raise_for_status()


def own_zone() -> str:
    """The fuzz identity's own speaker zone, s-<first 8 bytes of SHA-256 of the identity, hex>,
    where it may write (docs/PROTOCOL.md §3)."""
    return "s-" + hashlib.sha256(IDENTITY.encode()).hexdigest()[:16]


@schemathesis.hook
def map_path_parameters(context, path_parameters):
    # Half the generated zones (chosen by the value, so runs stay reproducible) become the
    # identity's own, so zone operations get past 403 to the storage.
    zone = (path_parameters or {}).get("zone")
    if isinstance(zone, str) and hashlib.sha256(zone.encode()).digest()[0] % 2 == 0:
        path_parameters["zone"] = own_zone()
    return path_parameters


@schemathesis.hook
def before_call(context, case, kwargs):
    # Every request is signed (bad credentials are the Swift tests' work): a generated
    # Authorization header would only ever meet a 401.
    if case.headers:
        case.headers.pop("Authorization", None)
    kwargs["auth"] = ConvKitSignature()
