"""How strong a shared token is, estimated conservatively, and the refusal of a
weak one where the daemon listens off loopback.

A captured signed request (signed/auth.py) lets anyone try tokens offline, as
fast as HMAC runs: a token from a word list, or a short one, falls in minutes.
The estimate counts, for each character position, the bits of the smallest
alphabet that holds the token (hex digits, one case, letters, letters and
digits, printable ASCII) and never more than the string's own per-character
Shannon entropy; and it counts only positions that start a 3-gram not seen
before, so a pattern repeated ("abcabc…", a word twice) adds nothing. A random
string loses a few bits per character to the empirical entropy, so the bar of
MIN_BITS is met by 64 hex digits (`openssl rand -hex 32`, ~240 bits) or a
43-character url-safe string (`python3 -c 'import secrets;
print(secrets.token_urlsafe(32))'`), and refuses passphrases of a few words
(tests/unit/publish/test_token_strength_unit.py)."""
from __future__ import annotations

import math
import string
from collections import Counter

MIN_BITS = 128
STRONG_COMMAND = "openssl rand -hex 32"

_ALPHABETS = (set(string.hexdigits.lower()), set(string.hexdigits.upper()),
              set(string.ascii_lowercase), set(string.ascii_uppercase),
              set(string.ascii_letters), set(string.ascii_letters + string.digits),
              set(string.ascii_letters + string.digits + "-_"),
              set(string.printable.strip()))


def bits(token: str) -> float:
    """A conservative estimate of the token's entropy in bits."""
    if not token:
        return 0.0
    chars = set(token)
    alphabet = next((len(a) for a in _ALPHABETS if chars <= a), 256)
    counts = Counter(token)
    shannon = -sum(n / len(token) * math.log2(n / len(token)) for n in counts.values())
    grams = {token[i:i + 3] for i in range(max(1, len(token) - 2))}
    positions = len(grams) + min(2, len(token) - 1)
    return positions * min(math.log2(alphabet), shannon)


def weakness(token: str) -> str | None:
    """Why the token is too weak to guard a daemon off loopback, or None."""
    estimate = bits(token)
    if estimate >= MIN_BITS:
        return None
    return (f"too weak (about {max(estimate, 0.0):.0f} bits of entropy, at least {MIN_BITS} wanted: "
            f"anyone who captures one signed request can try tokens offline); make one "
            f"with `{STRONG_COMMAND}`")
