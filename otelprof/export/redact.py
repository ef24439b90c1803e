"""Masks credentials in configuration values before they are shown: URL user info (user name
and password: a token is often the user name), query and fragment, and header values.

Text only, no URL parsing: a value that ``urllib`` cannot parse (``http://u:p@[::1``) is
masked too, and nothing here raises.
"""

from __future__ import annotations

import re

MASK = "***"
_SCHEME = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*://")
_QUERY = re.compile(r"[?#].*", re.DOTALL)  # an API key in the query is common; see public_url
#: RFC 9110 token: the characters a header name may have.
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def redact_url(text: str) -> str:
    """``text`` with the user info (everything between the scheme and the last ``@``) and the
    query and fragment masked: ``http://***@host:4318/v1/traces?***``.

    The last ``@``, not the authority's: a password with an unencoded ``/``, ``?`` or ``#``
    would otherwise end the authority early and be shown. An ``@`` in a path is masked with it,
    which only costs some of the shown path.
    """
    head, at, rest = text.rpartition("@")
    if at:
        scheme = _SCHEME.match(head)
        start = scheme.end() if scheme else len(head) - len(head.lstrip())
        head = head[:start] + MASK + at
    return head + _QUERY.sub(lambda m: m.group(0)[0] + MASK, rest)


def redact_headers(text: str) -> str:
    """``key=value,...`` with every value masked, and any key that is not a header name (a
    mistyped separator can leave a secret there)."""
    entries = []
    for entry in text.split(","):
        key, sep, _secret = entry.partition("=")
        key = key.strip()
        entries.append(f"{key}={MASK}" if sep and HEADER_NAME.fullmatch(key) else MASK)
    return ",".join(entries)
