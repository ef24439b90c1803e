"""Text helpers shared by the span model, the options and the reference converter."""


def clean(text: str) -> str:
    """Replace lone surrogates (from ``\\ud800``-style escapes) with U+FFFD, as the native reader does."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
