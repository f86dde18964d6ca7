"""Identity from an OpenID Connect / JWT identity provider: bearer tokens the issuer signed, verified
against its published keys (JWKS), accepted beside Sluice's own tokens.

A token is accepted only when its signature verifies against one of the issuer's keys (by `kid`, with the
key's own algorithm: never `none`, never a shared secret), and its `exp`, `nbf`, `iss` and `aud` hold.
Each refusal says which check failed. The user is one claim (`sub` by default); the groups claim makes the
user a member of queues (group_queues) and an admin (admin_groups). Keys are read at the first token, again
when older than max_age_s, and again when a token names a `kid` not among them (at most once per
refetch_s: a flood of made-up kids cannot make the dispatcher hammer the issuer).
"""
from __future__ import annotations

import json
import logging
import pathlib
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import jwt

from dispatcher.errors import Unauthenticated
from dispatcher.store.tokens import Principal
from sluice.transport import is_loopback_host

log = logging.getLogger(__name__)
MAX_JWKS_BYTES = 1 << 20
PUBLIC_KEY_TYPES = ("RSA", "EC", "OKP")
FETCH_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class OidcSettings:
    issuer: str = ""  # the `iss` tokens must carry; "" accepts no identity provider's tokens (the default)
    audience: str = ""  # the `aud` tokens must carry (this dispatcher's client id at the issuer)
    jwks: str = ""  # the issuer's keys: a file path, or an https:// URL (http:// only on a loopback address)
    ca: str = ""  # PEM file of the CA that signed the https JWKS URL's certificate; "": the system's roots
    user_claim: str = "sub"  # the claim that names the user (as queues' members and jobs' submitted_by)
    groups_claim: str = "groups"  # the claim listing the user's groups (a list of strings, or one string)
    group_queues: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # group -> queues its members join
    admin_groups: tuple[str, ...] = ()  # members of any of these groups are admins
    refetch_s: float = 30.0  # seconds: a token naming an unknown `kid` reads the keys again at most this often
    max_age_s: float = 900.0  # seconds: keys read longer ago are read again (a key the issuer withdrew goes)
    leeway_s: float = 0.0  # seconds of clock skew allowed on exp and nbf

    @property
    def enabled(self) -> bool:
        return bool(self.issuer)

    def problems(self) -> list[str]:
        """What makes these settings unusable, one line each (none when disabled)."""
        if not self.enabled:
            return []
        out = [f"{name} is required with an issuer" for name, value in
               (("audience", self.audience), ("jwks", self.jwks), ("user_claim", self.user_claim)) if not value]
        if self.jwks.startswith("http://") and not is_loopback_host(urllib.parse.urlsplit(self.jwks).hostname or ""):
            out.append(f"jwks: {self.jwks} is plain http on a non-loopback host; use https://")
        if self.ca and not self.jwks.startswith("https://"):
            out.append("ca: verifies an https:// JWKS URL; the jwks given is not one")
        elif self.ca and not pathlib.Path(self.ca).is_file():
            out.append(f"ca: {self.ca} is not a readable file")
        return out


def read_jwks(source: str, ca: str = "") -> dict:
    """The JWKS document at `source` (a path or an http(s) URL, https verified against `ca` or else the
    system's roots); ValueError says why it cannot be read."""
    try:
        if source.startswith(("https://", "http://")):
            context = ssl.create_default_context(cafile=ca or None) if source.startswith("https://") else None
            with urllib.request.urlopen(source, timeout=FETCH_TIMEOUT_S,  # noqa: S310 - scheme checked
                                        context=context) as reply:
                data = reply.read(MAX_JWKS_BYTES + 1)
        else:
            data = pathlib.Path(source).read_bytes()[:MAX_JWKS_BYTES + 1]
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {source}: {getattr(exc, 'reason', None) or exc}") from exc
    if len(data) > MAX_JWKS_BYTES:
        raise ValueError(f"{source}: larger than {MAX_JWKS_BYTES} bytes")
    try:
        document = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"{source}: not JSON ({exc})") from exc
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise ValueError(f"{source}: not a JWKS (an object with a 'keys' list)")
    return document


class IdentityProvider:
    """Verifies the issuer's tokens; thread-safe. `clock` (monotonic seconds) paces reading the keys."""

    def __init__(self, settings: OidcSettings, clock=time.monotonic):
        if problems := settings.problems():
            raise ValueError("identity provider: " + "; ".join(problems))
        self.settings = settings
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: dict[str | None, jwt.PyJWK] = {}
        self._read_at: float | None = None  # when the keys were last read
        self._refetched_at = -float("inf")  # when an unknown kid last made us read them
        self._failed_at = -float("inf")  # when reading them last failed, and why: tried again refetch_s later
        self._failure = ""
        self.reads = 0  # how many times the keys were read
        self.attempts = 0  # how many times reading them was tried

    def principal(self, token: str) -> Principal:
        s = self.settings
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError as exc:
            raise Unauthenticated(f"identity token: not a well-formed JWT ({exc})") from None
        key = self._key(header.get("kid"))
        try:
            claims = jwt.decode(token, key.key, algorithms=[key.algorithm_name], audience=s.audience, issuer=s.issuer,
                                leeway=s.leeway_s, options={"require": ["exp", "iss", "aud"]})
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("identity token: expired (exp is in the past)") from None
        except jwt.ImmatureSignatureError:
            raise Unauthenticated("identity token: not valid yet (nbf or iat is in the future)") from None
        except jwt.InvalidAudienceError:
            raise Unauthenticated(f"identity token: wrong audience (aud must include {s.audience!r})") from None
        except jwt.InvalidIssuerError:
            raise Unauthenticated(f"identity token: wrong issuer (iss must be {s.issuer!r})") from None
        except jwt.InvalidSignatureError:
            raise Unauthenticated(f"identity token: bad signature (key {header.get('kid')!r} does not verify it)"
                                  ) from None
        except jwt.MissingRequiredClaimError as exc:
            raise Unauthenticated(f"identity token: no {exc.claim!r} claim") from None
        except jwt.InvalidTokenError as exc:
            raise Unauthenticated(f"identity token: invalid ({exc})") from None
        user = claims.get(s.user_claim)
        if not isinstance(user, str) or not user:
            raise Unauthenticated(f"identity token: no {s.user_claim!r} claim naming the user")
        groups = claims.get(s.groups_claim) or []
        groups = [groups] if isinstance(groups, str) else [g for g in groups if isinstance(g, str)]
        return Principal(subject=user, role="admin" if set(groups) & set(s.admin_groups) else "user",
                         queues=frozenset(q for g in groups for q in s.group_queues.get(g, ())),
                         expires_at=datetime.fromtimestamp(claims["exp"], UTC))

    def _key(self, kid: str | None) -> jwt.PyJWK:
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at > self.settings.max_age_s:
                if now - self._failed_at >= self.settings.refetch_s:  # an issuer that is down is not hammered
                    self._read(now)
            elif kid not in self._keys and now - self._refetched_at >= self.settings.refetch_s:
                self._refetched_at = now  # rotated keys come in at once; a flood of unknown kids reads once
                self._read(now)
            if self._read_at is None:
                raise Unauthenticated(f"identity token: the issuer's keys could not be read ({self._failure})")
            keys = self._keys
        if kid is None and len(keys) == 1:
            return next(iter(keys.values()))
        if kid not in keys:
            raise Unauthenticated(f"identity token: key {kid!r} is not among the issuer's keys")
        return keys[kid]

    def _read(self, now: float) -> None:
        """Read the keys (holding the lock); on failure keep those read before (if any), and say why."""
        self.attempts += 1
        try:
            document = read_jwks(self.settings.jwks, self.settings.ca)
            keys = {}
            for entry in document["keys"]:
                if not isinstance(entry, dict) or entry.get("kty") not in PUBLIC_KEY_TYPES:
                    continue  # a shared secret published in a JWKS would let anyone sign
                try:
                    key = jwt.PyJWK(entry)
                except jwt.PyJWKError as exc:  # a key of a kind we do not verify with is skipped, not fatal
                    log.warning("identity provider key skipped", extra={"kid": entry.get("kid"), "error": str(exc)})
                    continue
                if entry.get("use", "sig") == "sig":
                    keys[entry.get("kid")] = key
        except ValueError as exc:
            log.warning("identity provider keys not read", extra={"error": str(exc)})
            self._failed_at, self._failure = now, str(exc)
            return
        self.reads += 1
        self._keys, self._read_at = keys, now
