"""Cache salts: whose prefix-cache entries a request may share (the server's policy).

A request's cache_salt (vLLM's field) keys its blocks in a domain of their own
(runtime/core/prefix_cache.py): requests share cache entries, and learn of each other's
prompts through `cached_tokens` or timing, only within one salt. The server's flags:

    --require-cache-salt        a request without a cache_salt is a 400
    --cache-salt-from-api-key   the salt is derived from the API key the request presents,
                                with its own cache_salt, if any, inside it: clients of
                                different keys never share entries, and no client can pick
                                another key's salt (it never chooses the salt, only a
                                subdomain of its own key's)
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from runtime.core.sampling_params import cache_salt_problem
from server.protocol import bad_request


@dataclass(frozen=True)
class CacheSalts:
    required: bool = False          # --require-cache-salt
    from_api_key: bool = False      # --cache-salt-from-api-key (needs --api-key)

    def of(self, given: str | None, authorization: str | None) -> str | None:
        """The salt a request's blocks are keyed under, from the cache_salt it gave and
        its Authorization header (already checked against the keys); a 400 naming
        cache_salt for a bad or (when required) missing one."""
        if (problem := cache_salt_problem(given)) is not None:
            raise bad_request(problem, "cache_salt")
        if given is None and self.required:
            raise bad_request("this server requires a cache_salt on every request (a "
                              "non-empty string, random and long enough to be unguessable)",
                              "cache_salt")
        return derived(authorization or "", given) if self.from_api_key else given


def derived(authorization: str, given: str | None) -> str:
    """The salt of a request presenting `authorization` with cache_salt `given`: a digest
    of both, one per (key, salt) pair. The key's digest has a fixed length and a tag byte
    marks whether a salt follows, so no two pairs encode alike. Headers arrive decoded as
    latin-1: encoding them so gives back the bytes the client sent."""
    key = hashlib.blake2b(authorization.encode("latin-1"), digest_size=32,
                          person=b"v4serve-apikey").digest()
    salt = b"\x00" if given is None else b"\x01" + given.encode("utf-8")
    return hashlib.blake2b(key + salt, digest_size=32, person=b"v4serve-keysalt").hexdigest()
