"""Readable span names: kernel names folded, device types named (mirrors native/src/names.cpp).

A demangled kernel name is a whole C++ signature, sometimes thousands of characters long::

    void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>,
        at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)

and a tree in a trace viewer shows its first 25 to 32 characters. ``fold_kernel_name`` writes
what tells kernels apart first: ``add<float> · vectorized_elementwise<4, Array<char*, 3>> ·
at::native``. The rules (docs/semantic-conventions.md, "Kernel names"):

1. ``(anonymous namespace)::`` is removed. A mangled name (``_Z…``, ASCII) becomes its
   qualified name, template arguments as ``<…>``; one that cannot be read is only cut (rule 7).
2. The parameter list (the first ``(`` outside brackets that is not ``operator()``'s nor
   ``decltype(``'s) and all after it are dropped, and so is everything up to the last space
   before it outside brackets (the return type).
3. Template arguments are read as names: namespaces dropped (the last ``::`` part), a local
   entity (a lambda) replaced by the function that defines it (``X::operator()``: by ``X``), a
   cast ``(T)v`` by ``v``.
4. The operation: the first callable among the function's template arguments, depth first (a
   lambda, or a name with a word ``Functor``/``functor``/``Op``/``Ops``), then the first
   callable inside that one, and so on; a function whose name is only noise words and numbers
   (``cutlass::Kernel``) takes its first argument, when it is a name, as its operation. The
   span name is its parts joined by `` · ``: the innermost operation (followed by its lambda's
   parameter types), each enclosing operation, the function, the function's namespace; each
   part keeps the template arguments not lifted out (a list left empty is dropped).
5. In each part's head, the noise words ``kernel``, ``functor``, ``cuda``, ``impl`` (any case,
   as words of a ``snake_case``/``CamelCase`` identifier, with the ``_`` they would leave
   dangling) are dropped, unless no letter would be left. The first part's head, when its first
   ``_`` token is a platform word (an architecture ``sm80``, ``gfx942``, ``volta``, …; a
   library ``cutlass``, ``cudnn``, ``xmma``, …), gives its leading run of platform words,
   numbers, ``infer`` and ``train`` to a part of its own right after it (unless nothing would
   be left); then its first tile token (``_``-separated, with digits ``x`` digits:
   ``bt128x128x32``), when it would end past the ``VISIBLE``-th character, moves forward to the
   latest token boundary (after the first token at the earliest) where it ends within them.
6. A template argument list longer than ``LIST_LIMIT`` characters is written again with the
   lists of its arguments longer than ``ARG_LIMIT`` characters as ``<…>``; still too long, it
   is ``<…>`` (a lambda's parameters: ``(…)``).
7. The result is cut at ``NAME_LIMIT`` characters (the last one ``…``).

Brackets are ``<>``, ``()``, ``[]``, ``{}``, counted together; a name whose brackets do not
balance, or nest deeper than ``DEPTH_LIMIT``, is only cut (rule 7). Scanning looks only at
ASCII characters and lengths count characters (code points), so the C++ port, which works on
UTF-8 bytes, gives the same text.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from .spans import Span

ELLIPSIS = "\u2026"
#: Between the parts of a folded name.
SEPARATOR = " \u00b7 "
#: Characters of a template argument list's text kept before it is folded.
LIST_LIMIT = 64
#: Characters of one argument kept with its own lists when its list is too long.
ARG_LIMIT = 24
#: Characters of a folded name.
NAME_LIMIT = 128
#: Characters a tree shows of a span name: a tile token is moved to end within them.
VISIBLE = 32
#: Bracket nesting read: a name nested deeper is only cut (real ones nest 5 deep; reading
#: recurses, and 300 levels exhausted Python's stack, 10,000 the native one's).
DEPTH_LIMIT = 32

_OPEN = "<([{"
_CLOSE = ">)]}"
_ANONYMOUS = "(anonymous namespace)::"
_SPACE = " \t\n\r\f\v"  # ASCII only, as the C++ port strips
#: Words that say nothing on a kernel span (rule 5).
_NOISE = frozenset({"kernel", "functor", "cuda", "impl"})
#: A template argument with one of these words is an operation (rule 4).
_CALLABLE = frozenset({"functor", "op", "ops"})
#: Architectures and libraries that prefix flat kernel names (rule 5), with sm<N> and gfx<N>.
_PLATFORM = frozenset(
    {"kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell",
     "cutlass", "cudnn", "cublas", "cublaslt", "cask", "xmma", "tensorop"}
)  # fmt: skip
_PLATFORM_MORE = frozenset({"infer", "train"})
#: Template arguments that are no name (a generic function's operation is a name, rule 4).
_BUILTIN = frozenset(
    {"void", "bool", "char", "wchar_t", "char8_t", "char16_t", "char32_t", "short", "int", "long", "signed",
     "unsigned", "float", "double", "auto", "const", "volatile", "true", "false", "nullptr", "decltype"}
)  # fmt: skip


class _Unbalanced(Exception):
    pass


class _Node:
    """``head<args>tail``: a name and its template arguments (``args`` None: no list);
    ``params``: the parameter types of the lambda a local entity stands for."""

    __slots__ = ("args", "gone", "head", "local", "params", "tail")

    def __init__(self, head: str, args: list[_Node] | None, tail: str) -> None:
        self.head = head
        self.args = args
        self.tail = tail
        self.params: list[_Node] | None = None
        self.local = False  # a local entity (rule 3): an operation
        self.gone = False  # lifted out of its parent's list (rule 4)


def _digit(c: str) -> bool:
    return "0" <= c <= "9"


def _upper(c: str) -> bool:
    return "A" <= c <= "Z"


def _lower(c: str) -> bool:
    return "a" <= c <= "z"


def _alnum(c: str) -> bool:
    return _digit(c) or _upper(c) or _lower(c)


def _ascii_lower(s: str) -> str:
    return "".join(chr(ord(c) + 32) if _upper(c) else c for c in s)


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


# --- reading: names and their template arguments (rules 2-3) ---------------------------------


def _parse(t: str) -> _Node:
    """``t`` as a head, its first template argument list outside brackets, and what follows."""
    i = 0
    while i < len(t):
        c = t[i]
        if c in _OPEN:
            j = _close(t, i)
            if c == "<":
                return _Node(t[:i], _parse_args(t[i + 1 : j]), t[j + 1 :])
            i = j + 1
            continue
        i += 1
    return _Node(t, None, "")


def _parse_args(inner: str) -> list[_Node]:
    return [_parse_arg(a) for a in _split(inner, ",")]


def _parse_arg(a: str) -> _Node:
    """One template argument (rule 3)."""
    segments = _split(a.strip(_SPACE), "::")
    chosen = segments[-1]
    local = False
    for k, seg in enumerate(segments):
        p = _function_paren(seg)
        if p > 0:  # a function: what follows is local to it (a lambda)
            chosen, local = seg[:p], True
            if chosen == "operator()" and k > 0:
                chosen = segments[k - 1]
            break
    chosen = chosen.strip(_SPACE)
    if chosen.startswith("("):  # a cast: (cudnnKernelDataType_t)2
        chosen = chosen[_close(chosen, 0) + 1 :].strip(_SPACE)
    node = _parse(chosen)
    if local:
        node.local = True
        node.params = _lambda_params(segments[-1].strip(_SPACE))
    return node


def _lambda_params(seg: str) -> list[_Node] | None:
    """The parameter types of ``{lambda(float, float)#1}`` (``[lambda(int) (instance 1)]`` as
    nsys writes it); None for another entity or no parameters."""
    if not (seg.startswith("{lambda(") or seg.startswith("[lambda(")):
        return None
    inner = seg[8 : _close(seg, 7)]
    return _parse_args(inner) if inner.strip(_SPACE) else None


# --- writing (rules 4-6) -------------------------------------------------------------------------


def _render(n: _Node, nested: bool, head: str | None = None, params: bool = False) -> str:
    """``n`` with its lists folded (``nested``) or ``<…>``, the arguments lifted out left out."""
    text = n.head if head is None else head
    if n.args is not None:
        kept = [a for a in n.args if not a.gone]
        if kept:
            text += _list_text(kept) if nested else "<" + ELLIPSIS + ">"
    text += _lists(n.tail, nested)
    if params and n.params is not None:
        inner = ", ".join(_render(p, True) for p in n.params)
        text += "(" + (inner if len(inner) <= LIST_LIMIT else ELLIPSIS) + ")"
    return text


def _list_text(args: list[_Node]) -> str:
    """A template argument list, brackets included (rule 6)."""
    full = [_render(a, True) for a in args]
    text = ", ".join(full)
    if len(text) <= LIST_LIMIT:
        return "<" + text + ">"
    text = ", ".join(f if len(f) <= ARG_LIMIT else _render(a, False) for a, f in zip(args, full, strict=True))
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
                out.append(_list_text(_parse_args(s[i + 1 : j])) if nested else "<" + ELLIPSIS + ">")
            else:
                out.append(s[i : j + 1])
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _words(s: str) -> list[tuple[int, int]]:
    """(start, end) of each word of an identifier: runs of ASCII letters and digits, split at
    ``aB``, ``ABc`` (before ``B``), letter-digit and digit-letter."""
    out: list[tuple[int, int]] = []
    i, n = 0, len(s)
    while i < n:
        if not _alnum(s[i]):
            i += 1
            continue
        j = i + 1
        while j < n and _alnum(s[j]):
            a, b = s[j - 1], s[j]
            if (
                (_lower(a) and _upper(b))
                or (_upper(a) and _upper(b) and j + 1 < n and _lower(s[j + 1]))
                or (_digit(a) != _digit(b))
            ):
                break
            j += 1
        out.append((i, j))
        i = j
    return out


def _word_set(s: str) -> set[str]:
    return {_ascii_lower(s[a:b]) for a, b in _words(s)}


def _strip_noise(h: str) -> str:
    """``h`` without its noise words, each with an ``_`` that would be left dangling (rule 5)."""
    out = h
    for a, b in reversed(_words(h)):
        if _ascii_lower(h[a:b]) not in _NOISE:
            continue
        left = out[a - 1] if a > 0 else ""
        right = out[b] if b < len(out) else ""
        if left == "_" and right in ("_", ""):
            a -= 1
        elif left == "" and right == "_":
            b += 1
        out = out[:a] + out[b:]
    return out if any(_upper(c) or _lower(c) for c in out) else h


def _is_callable(n: _Node) -> bool:
    return n.local or not _CALLABLE.isdisjoint(_word_set(n.head))


def _find_callable(n: _Node) -> _Node | None:
    """The first callable among ``n``'s template arguments, depth first."""
    for a in n.args or ():
        if _is_callable(a):
            return a
        found = _find_callable(a)
        if found is not None:
            return found
    return None


def _is_generic(h: str) -> bool:
    """``h`` is only noise words and numbers (``Kernel``, ``Kernel2``)."""
    words = [_ascii_lower(h[a:b]) for a, b in _words(h)]
    return any(w in _NOISE for w in words) and all(w in _NOISE or _digit(w[0]) for w in words)


def _is_name(n: _Node) -> bool:
    h = n.head
    if not h or not (_upper(h[0]) or _lower(h[0]) or h[0] == "_"):
        return False
    end = 0
    while end < len(h) and (_alnum(h[end]) or h[end] == "_"):
        end += 1
    return h[:end] not in _BUILTIN


def _is_platform(t: str) -> bool:
    t = _ascii_lower(t)
    if t in _PLATFORM:
        return True
    for prefix in ("sm", "gfx"):
        if t.startswith(prefix) and len(t) > len(prefix) and _digit(t[len(prefix)]):
            return all(_alnum(c) for c in t)
    return False


def _platform_split(h: str) -> tuple[str, str]:
    """(``h`` without its leading platform words, those words), unless nothing is left (rule 5)."""
    tokens = h.split("_")
    if len(tokens) < 2 or not _is_platform(tokens[0]):
        return h, ""
    k = 1
    while k < len(tokens) - 1 and (
        _is_platform(tokens[k])
        or _ascii_lower(tokens[k]) in _PLATFORM_MORE
        or (tokens[k] != "" and all(_digit(c) for c in tokens[k]))
    ):
        k += 1
    rest = "_".join(tokens[k:])
    return (rest, "_".join(tokens[:k])) if rest else (h, "")


def _is_tile(t: str) -> bool:
    return any(t[i] == "x" and _digit(t[i - 1]) and _digit(t[i + 1]) for i in range(1, len(t) - 1))


def _tile_forward(h: str) -> str:
    """``h`` with its first tile token moved to end within ``VISIBLE`` characters (rule 5)."""
    tokens = h.split("_")
    t = next((k for k, tok in enumerate(tokens) if _is_tile(tok)), 0)
    tile = tokens[t]
    if t == 0 or len("_".join(tokens[: t + 1])) <= VISIBLE:
        return h
    k = t - 1
    while k > 1 and len("_".join(tokens[:k])) + 1 + len(tile) > VISIBLE:
        k -= 1
    return "_".join([*tokens[:k], tile, *tokens[k:t], *tokens[t + 1 :]])


def _fold(s: str) -> str:
    core = s
    p = _function_paren(s)
    if p >= 0:  # rule 2
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
    segments = _split(core, "::")
    fn = _parse(segments[-1])
    chain: list[_Node] = []  # rule 4: outermost operation first
    op = _find_callable(fn)
    if op is None and fn.args is not None and _is_generic(fn.head) and _is_name(fn.args[0]):
        op = fn.args[0]
    while op is not None:
        op.gone = True
        chain.append(op)
        op = _find_callable(op)
    lead = chain[-1] if chain else fn
    parts: list[str] = []
    for node in [*reversed(chain), fn]:
        head, platform = _platform_split(node.head) if node is lead else (node.head, "")
        head = _strip_noise(head)
        if node is lead:
            head = _tile_forward(head)
        parts.append(_render(node, True, head, params=node is lead and node is not fn))
        if platform:
            parts.append(platform)
    if len(segments) > 1:
        parts.append(_lists(core[: len(core) - len(segments[-1]) - 2], True))
    return SEPARATOR.join(parts)


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
        j, n = i, 0
        while j < len(s) and "0" <= s[j] <= "9":
            n = n * 10 + ord(s[j]) - 48
            if n > len(s):  # longer than the rest (and int() refuses over 4300 digits)
                return s
            j += 1
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
        demangled = _demangled_prefix(s)
        if demangled == s:  # not readable: only cut
            return _cap(s)
        s = demangled
    if _too_deep(s):
        return _cap(s)
    try:
        return _cap(_fold(s))
    except _Unbalanced:
        return _cap(s)


def _too_deep(s: str) -> bool:
    depth = 0
    for c in s:
        if c in _OPEN:
            depth += 1
            if depth > DEPTH_LIMIT:
                return True
        elif c in _CLOSE:
            depth -= 1
    return False


def cut_strings(spans: Iterable[Span], name_limit: int, value_limit: int | None) -> int:
    """The converter's length limits on spans (docs/semantic-conventions.md, "Length limits";
    native ``cut_strings`` in build_assemble.cpp): each name longer than ``name_limit`` characters and
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
