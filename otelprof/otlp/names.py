"""Readable span names: kernel names folded, device types named (mirrors native/src/names.cpp).

A demangled kernel name is a whole C++ signature, sometimes thousands of characters long::

    void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>,
        at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)

``fold_kernel_name`` turns it into ``at::native::vectorized_elementwise_kernel<4,
CUDAFunctor_add<float>, Array<char*, 3>>``. The rule (docs/semantic-conventions.md, "Kernel
names"), applied in this order:

1. ``(anonymous namespace)::`` is removed everywhere.
2. A mangled name (``_Z…``, ASCII) becomes its qualified name, template arguments as ``<…>``.
3. When the name has a parameter list (the first ``(`` outside brackets, not ``operator()``'s
   nor ``decltype(``'s),
   the list and everything after it is dropped, and so is everything up to the last space
   before it outside brackets (the return type, ``void``).
4. The function's own qualified name is kept. Each template argument list is written with each
   argument shortened: its namespaces dropped (the last ``::`` part), a local entity (lambda)
   replaced by the function it is defined in (``threshold_kernel_impl<float>``; for
   ``X::operator()``, by ``X``), a cast ``(T)v`` by ``v``, its own lists folded by this same
   rule. A list whose text is longer than ``LIST_LIMIT`` characters is written again with
   the lists of its arguments longer than ``ARG_LIMIT`` characters as ``<…>``; still too long,
   it is ``<…>``.
5. The result is cut at ``NAME_LIMIT`` characters (the last one ``…``).

Brackets are ``<>``, ``()``, ``[]``, ``{}``, counted together; a name whose brackets do not
balance is only cut (step 5). Scanning looks only at ASCII characters and lengths count
characters (code points), so the C++ port, which works on UTF-8 bytes, gives the same text.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from .spans import Span

ELLIPSIS = "\u2026"
#: Characters of a template argument list's text kept before it is folded.
LIST_LIMIT = 64
#: Characters of one argument kept with its own lists when its list is too long.
ARG_LIMIT = 24
#: Characters of a folded name.
NAME_LIMIT = 128

_OPEN = "<([{"
_CLOSE = ">)]}"
_ANONYMOUS = "(anonymous namespace)::"
_SPACE = " \t\n\r\f\v"  # ASCII only, as the C++ port strips


class _Unbalanced(Exception):
    pass


def _close(s: str, i: int) -> int:
    """Index of the bracket that closes the one at ``s[i]``."""
    depth = 0
    for j in range(i, len(s)):
        c = s[j]
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if depth == 0:
                return j
    raise _Unbalanced


def _is_call_operator(s: str, i: int) -> bool:
    """``s[i]`` is the ``(`` of ``operator()``."""
    return s.endswith("operator", 0, i) and s[i + 1 : i + 2] == ")"


def _is_decltype(s: str, i: int) -> bool:
    """``s[i]`` is the ``(`` of ``decltype(…)``."""
    return s.endswith("decltype", 0, i)


def _split(s: str, sep: str) -> list[str]:
    """``s`` split at ``sep`` outside brackets."""
    parts: list[str] = []
    start = i = 0
    while i < len(s):
        c = s[i]
        if c in _OPEN:
            i = _close(s, i) + 1
            continue
        if s.startswith(sep, i):
            parts.append(s[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(s[start:])
    return parts


def _function_paren(s: str) -> int:
    """Index of the first ``(`` outside brackets that is not ``operator()``'s, or -1."""
    i = 0
    while i < len(s):
        c = s[i]
        if c == "(" and _is_call_operator(s, i):
            i += 2
            continue
        if c == "(" and not _is_decltype(s, i):
            return i
        if c in _OPEN:
            i = _close(s, i) + 1
            continue
        i += 1
    return -1


def _arg(a: str, nested: bool) -> str:
    """One template argument, shortened (rule 4)."""
    segments = _split(a.strip(_SPACE), "::")
    chosen = segments[-1]
    for k, seg in enumerate(segments):
        p = _function_paren(seg)
        if p > 0:  # a function: what follows is local to it (a lambda)
            chosen = seg[:p]
            if chosen == "operator()" and k > 0:
                chosen = segments[k - 1]
            break
    chosen = chosen.strip(_SPACE)
    if chosen.startswith("("):  # a cast: (cudnnKernelDataType_t)2
        chosen = chosen[_close(chosen, 0) + 1 :].strip(_SPACE)
    return _lists(chosen, nested)


def _list(inner: str) -> str:
    """A template argument list's text, brackets included (rule 4)."""
    args = _split(inner, ",")
    full = [_arg(a, True) for a in args]
    text = ", ".join(full)
    if len(text) <= LIST_LIMIT:
        return "<" + text + ">"
    text = ", ".join(f if len(f) <= ARG_LIMIT else _arg(a, False) for a, f in zip(args, full, strict=True))
    if len(text) <= LIST_LIMIT:
        return "<" + text + ">"
    return "<" + ELLIPSIS + ">"


def _lists(s: str, nested: bool) -> str:
    """``s`` with each template argument list outside brackets folded (``nested``) or ``<…>``."""
    out: list[str] = []
    i = 0
    while i < len(s):
        c = s[i]
        if c in _OPEN:
            j = _close(s, i)
            if c == "<":
                out.append(_list(s[i + 1 : j]) if nested else "<" + ELLIPSIS + ">")
            else:
                out.append(s[i : j + 1])
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _demangled_prefix(s: str) -> str:
    """A mangled name's qualified name (``_ZN2at6native6kernelI…`` -> ``at::native::kernel<…>``),
    or ``s`` when it does not start with one."""
    i = 2
    nested = s.startswith("N", i)
    if nested:
        i += 1
        while i < len(s) and s[i] in "rVKRO":
            i += 1
    parts: list[str] = []
    while i < len(s) and "0" <= s[i] <= "9":
        j = i
        while j < len(s) and "0" <= s[j] <= "9":
            j += 1
        n = int(s[i:j])
        if n == 0 or j + n > len(s):
            return s
        ident = s[j : j + n]
        i = j + n
        if not ident.startswith("_GLOBAL__N"):
            parts.append(ident)
        if not nested:
            break
    if not parts:
        return s
    name = "::".join(parts)
    if s.startswith("I", i):
        name += "<" + ELLIPSIS + ">"
    return name


def _cap(s: str) -> str:
    return s if len(s) <= NAME_LIMIT else s[: NAME_LIMIT - 1] + ELLIPSIS


@lru_cache(maxsize=8192)
def fold_kernel_name(name: str) -> str:
    """The span name of a kernel called ``name`` (see the module's docstring)."""
    s = name.replace(_ANONYMOUS, "")
    if s.startswith("_Z") and s.isascii():
        return _cap(_demangled_prefix(s))
    try:
        core = s
        p = _function_paren(s)
        if p >= 0:
            start, i = 0, 0
            while i < p:
                c = s[i]
                if c in _OPEN:
                    i = _close(s, i) + 1
                    continue
                if c == " ":
                    start = i + 1
                i += 1
            core = s[start:p]
        return _cap(_lists(core, True))
    except _Unbalanced:
        return _cap(s)


def cut_strings(spans: Iterable[Span], name_limit: int, value_limit: int | None) -> int:
    """The converter's length limits on spans (docs/semantic-conventions.md, "Length limits";
    native ``cut_strings`` in builder.cpp): each name longer than ``name_limit`` characters and
    each string attribute value longer than ``value_limit`` (None: no limit) keeps its first
    that many, unmarked, as OpenTelemetry's attribute value length limit cuts. Returns how many
    were cut."""
    cut = 0
    for sp in spans:
        if len(sp.name) > name_limit:
            sp.name = sp.name[:name_limit]
            cut += 1
        if value_limit is None:
            continue
        for k, (key, value) in enumerate(sp.attrs):
            if isinstance(value, str) and len(value) > value_limit:
                sp.attrs[k] = (key, value[:value_limit])
                cut += 1
    return cut


#: c10::DeviceType numbering (c10/core/DeviceType.h), as the profiler's ``Device Type``.
DEVICE_TYPES = (
    "cpu", "cuda", "mkldnn", "opengl", "opencl", "ideep", "hip", "fpga", "maia", "xla", "vulkan", "metal",
    "xpu", "mps", "meta", "hpu", "ve", "lazy", "ipu", "mtia", "privateuseone",
)  # fmt: skip


def device_name(device_type: int | None, device_id: int | None) -> str | None:
    """``cpu``, ``cuda:0``, …: torch's spelling of a device (no index for the CPU or when the
    index is negative or absent); None for a type c10 does not number."""
    if device_type is None or not 0 <= device_type < len(DEVICE_TYPES):
        return None
    kind = DEVICE_TYPES[device_type]
    if device_type == 0 or device_id is None or device_id < 0:
        return kind
    return f"{kind}:{device_id}"


def hex_address(v: int) -> str:
    """``0x`` and the lowercase hex digits of ``v`` as an unsigned 64-bit number."""
    return f"0x{v & 0xFFFFFFFFFFFFFFFF:x}"
