"""Python objects as the adapter's lowercase methods move them (``_objects.py``).

Every object becomes a **header** of ``WORDS`` (16) int64 words, the same size for every
object, and zero or more byte **parts**:

    word 0    kind (bits 0-7), aux (8-31: dtype, length, element types, buffers),
              rounds (32-62: parts the sender has, its most for alltoall)
    word 1    the call: method and root, the same in every header of one call
    word 2    length of part 0 (a pickle stream, or an array's bytes)
    word 3-15 the value itself (104 bytes), an array's shape, or the lengths of the
              first out-of-band buffers

What fits in words 3-15 travels in the header alone: None, bool, int (int64's range),
float, complex, NumPy scalars of the numeric dtypes below, str and bytes up to 104
bytes (UTF-8), tuples and lists of up to 10 ints, floats, bools or Nones (shapes,
counts, small records), none of them pickled; and any other object whose pickle stream
is that short.  A NumPy array of those dtypes (up to 7-D) is part 0 as it lies in
memory (C or Fortran order; anything else is copied to C order first, as pickle does).
Anything else is pickled with mpi4py's own pickler (``MPI.pickle``: its dumps/loads,
protocol and threshold, so a custom pickler set there is used here too): protocol 5,
buffers of at least ``MPI.pickle.THRESHOLD`` bytes out of band (parts 1, 2, ..., never
copied), as ``mpi4py.util.pkl5`` does.  The methods that send one object per
destination (scatter, alltoall) pickle in band.

A header of 128 bytes against mpi4py's 8-byte count: one collective of 128 bytes per
rank costs what one of 8 bytes costs, and saves the second collective for every object
above.

Decoded values are new objects, as after mpi4py's pickle round trip: arrays and
out-of-band buffers are views of the receive buffer of their round.
"""
from __future__ import annotations

import struct
import zlib

import numpy as np

from ..errors import CollectiveMismatch, HpcCollError
from ..base.ops import OPS
from ._types import MPI

WORDS = 16
INLINE = WORDS - 3             # words 3-15
INLINE_BYTES = INLINE * 8
MAX_ITEMS = 10                 # of a tuple or list in the header (aux: 4 + 2 bits each)
MAX_NDIM = 7                   # of an array moved as its bytes (aux: 3 bits)

# kinds
(NONE, BOOL, INT, FLOAT, COMPLEX, NPSCALAR, STR, RAW, TUPLE, LIST, ARRAY, PICKLED,
 SMALL_PICKLE) = range(1, 14)
FAILED = 255                   # the sender could not encode its object (it raises why)

_AUX_SHIFT, _ROUNDS_SHIFT = 8, 32
_AUX_MASK = (1 << 24) - 1
_FAILED_CALL = 1 << 62        # word 1 of a FAILED header: no rank's call looks like it
_I64 = (-(1 << 63), 1 << 63)

# NumPy dtypes moved as their bytes; the code is the aux field.  Compared by the type
# character too: 'q' (longlong) equals 'l' (int64) as a dtype but pickles as itself.
_DTYPES = tuple(np.dtype(c) for c in "?bBhHiIlLefdFD")
_DTYPE_CODE = {dt: i for i, dt in enumerate(_DTYPES)}
_SCALAR_TYPES = {dt.type: i for i, dt in enumerate(_DTYPES)}

_EMPTY = np.empty(0, np.uint8)
_structs: dict = {}


def _struct(fmt: str) -> struct.Struct:
    s = _structs.get(fmt)
    if s is None:
        s = _structs[fmt] = struct.Struct(fmt)
    return s


_S_FLOAT = _struct(f"<3qd{INLINE_BYTES - 8}x")
_S_COMPLEX = _struct(f"<3q2d{INLINE_BYTES - 16}x")
_S_BYTES = _struct(f"<3q{INLINE_BYTES}s")

_DOUBLE = _struct("<d")


_OP_SHIFT = 40                # word 1: method (8 bits), root (32), op (22)
_NAMED = tuple(OPS)           # MPI's ops hpccoll names (base/ops.py), by their code - 1
# and those it does not, codes after them
_OTHER_OPS = ((MPI.MAXLOC, "MAXLOC"), (MPI.MINLOC, "MINLOC"), (MPI.REPLACE, "REPLACE"),
              (MPI.NO_OP, "NO_OP"))
_USER_OP = 1 << 16
# (op, code) pairs, looked through by identity (an MPI.Op is unhashable): the per-call path
# of every lowercase reduction
_CODES = tuple((getattr(MPI, OPS[n].mpi), 1 + i) for i, n in enumerate(_NAMED)) + \
    tuple((o, 1 + len(_NAMED) + i) for i, (o, _) in enumerate(_OTHER_OPS))


def meta(method: int, root: int, op: int = 0) -> int:
    """Word 1: what every rank's header of one call shares (_objects._headers writes it
    out): the method, the root and, for reductions, the op (``op_code``)."""
    return method | (root << 8) | (op << _OP_SHIFT)


def op_code(op) -> int:
    """What word 1 says of a reduction's op, the same on every rank for the same op: a
    small code for MPI's predefined ones, else a hash of the callable's qualified name
    (every MPI.Op made by MPI.Op.Create is one op)."""
    for known, code in _CODES:
        if op is known:
            return code
    if isinstance(op, MPI.Op):
        return _USER_OP
    name = (f"{getattr(op, '__module__', None) or type(op).__module__}."
            f"{getattr(op, '__qualname__', None) or type(op).__qualname__}")
    return _USER_OP | (1 + (zlib.crc32(name.encode()) & 0xFFFE))


def _op_name(code: int) -> str:
    if 0 < code <= len(_NAMED):
        return OPS[_NAMED[code - 1]].mpi
    if code <= len(_NAMED) + len(_OTHER_OPS):
        return _OTHER_OPS[code - 1 - len(_NAMED)][1]
    return "an MPI.Op.Create op" if code == _USER_OP else f"a Python callable #{code & 0xFFFF}"


class Encoded:
    """One object, encoded: its header (int64[WORDS]), its parts (uint8 arrays), or
    the exception encoding raised (the header then says FAILED)."""
    __slots__ = ("header", "parts", "error")

    def __init__(self, header, parts=(), error=None):
        self.header, self.parts, self.error = header, parts, error


def _header(out, fmt_struct, *words) -> np.ndarray:
    """``out`` (int64[WORDS]) filled with ``words`` as ``fmt_struct`` lays them out (every
    format here pads to the whole header: no byte of an earlier object stays)."""
    fmt_struct.pack_into(out, 0, *words)
    return out


def _ints(out, w0, m, length, rest=()) -> np.ndarray:
    """``out`` (int64[WORDS]) := w0, m, length, the ints of ``rest`` (each within
    int64), zeros; written word by word (in the compiled form into a typed view: a struct
    call with the items as arguments cost ~2,500 instructions for a shape)."""
    w = out
    w[0] = w0
    w[1] = m
    w[2] = length
    n = len(rest)
    for j in range(n):
        w[3 + j] = rest[j]
    for j in range(3 + n, WORDS):
        w[j] = 0
    return out


def new_header() -> np.ndarray:
    return np.empty(WORDS, np.int64)


def failed(m: int, exc: BaseException, out=None) -> Encoded:
    return Encoded(_ints(new_header() if out is None else out, FAILED, m | _FAILED_CALL, 0),
                   (), exc)


# -- encoding -------------------------------------------------------------------------------

def _none(obj, m, out):
    return Encoded(_ints(out, NONE, m, 0))


def _bool(obj, m, out):
    return Encoded(_ints(out, BOOL, m, 0, (int(obj),)))


def _float(obj, m, out):
    return Encoded(_header(out, _S_FLOAT, FLOAT, m, 0, obj))


def _complex(obj, m, out):
    return Encoded(_header(out, _S_COMPLEX, COMPLEX, m, 0, obj.real, obj.imag))


def _str(obj, m, out):
    try:
        data = obj.encode()
    except UnicodeEncodeError:   # lone surrogates: pickle keeps them
        return None
    if len(data) > INLINE_BYTES:
        return None
    return Encoded(_header(out, _S_BYTES, STR | (len(data) << _AUX_SHIFT), m, 0, data))


def _bytes(obj, m, out):
    if len(obj) > INLINE_BYTES:
        return None
    return Encoded(_header(out, _S_BYTES, RAW | (len(obj) << _AUX_SHIFT), m, 0, obj))


def _npscalar(obj, m, out):
    code = _SCALAR_TYPES[type(obj)]
    return Encoded(_header(out, _S_BYTES, NPSCALAR | (code << _AUX_SHIFT), m, 0,
                           obj.tobytes()))


# element codes of a small tuple or list: 2 bits each, after 4 bits of length
_E_INT, _E_FLOAT, _E_BOOL, _E_NONE = range(4)


def _sequence(obj, m, out, kind):
    n = len(obj)
    if n > MAX_ITEMS:
        return None
    for v in obj:               # ints only (a shape): element codes all 0
        if type(v) is not int or not _I64[0] <= v < _I64[1]:
            break               # (an int beyond int64's range: pickled, below)
    else:
        return Encoded(_ints(out, kind | (n << _AUX_SHIFT), m, 0, obj))
    aux, words, fmt = n, [], "<3q"
    for j, v in enumerate(obj):
        t = type(v)
        if t is int:
            if not _I64[0] <= v < _I64[1]:
                return None
            code, fmt = _E_INT, fmt + "q"
        elif t is float:
            code, fmt = _E_FLOAT, fmt + "d"
        elif t is bool:
            code, v, fmt = _E_BOOL, int(v), fmt + "q"
        elif v is None:
            code, v, fmt = _E_NONE, 0, fmt + "q"
        else:
            return None
        aux |= code << (4 + 2 * j)
        words.append(v)
    fmt += f"{8 * (INLINE - n)}x"
    return Encoded(_header(out, _struct(fmt), kind | (aux << _AUX_SHIFT), m, 0, *words))


def _array(obj, m, out):
    dt = obj.dtype
    code = _DTYPE_CODE.get(dt)
    if code is None or dt.char != _DTYPES[code].char or obj.ndim > MAX_NDIM:
        return None
    flags = obj.flags
    fortran = 0
    if flags.c_contiguous:
        flat = obj.reshape(-1)
    elif flags.f_contiguous:
        flat, fortran = obj.reshape(-1, order="F"), 1
    else:                        # what pickle sends of it: a C-ordered copy
        flat = np.ascontiguousarray(obj).reshape(-1)
    data = flat.view(np.uint8)
    aux = code | (obj.ndim << 5) | (fortran << 8)
    return Encoded(_ints(out, ARRAY | (aux << _AUX_SHIFT) | (1 << _ROUNDS_SHIFT), m, data.size,
                         obj.shape), (data,))


def pickled(obj, m, out_of_band: bool, out) -> Encoded:
    """``obj`` through mpi4py's pickler: a stream that fits in the header, or part 0 the
    stream, then its out-of-band buffers (all in band with ``out_of_band`` False)."""
    if out_of_band:
        stream, buffers = MPI.pickle.dumps_oob(obj)
    else:
        stream, buffers = MPI.pickle.dumps(obj), ()
    if not buffers and len(stream) <= INLINE_BYTES:
        return Encoded(_header(out, _S_BYTES, SMALL_PICKLE | (len(stream) << _AUX_SHIFT), m, 0,
                               stream))
    parts = [np.frombuffer(stream, np.uint8)]
    parts += [np.frombuffer(b, np.uint8) for b in buffers]
    w0 = PICKLED | (len(buffers) << _AUX_SHIFT) | (len(parts) << _ROUNDS_SHIFT)
    return Encoded(_ints(out, w0, m, parts[0].size, [p.size for p in parts[1:1 + INLINE]]),
                   parts)


# (float, int in int64's range, tuple and list: written out in encode; an int beyond
# int64 is pickled)
_ENCODERS = {type(None): _none, bool: _bool, float: _float, complex: _complex, str: _str,
             bytes: _bytes, np.ndarray: _array}
_ENCODERS.update((t, _npscalar) for t in _SCALAR_TYPES)


def encode(obj, m: int, out_of_band: bool = True, out=None) -> Encoded:
    """The header and parts of ``obj`` (``m``: ``meta(method, root)``), the header
    written into ``out`` (int64[WORDS]; a new array if None).  An object that cannot be
    pickled gives a FAILED header and the error, for the caller to raise after the header
    exchange (so that no rank is left waiting in it)."""
    if out is None:
        out = new_header()
    cls = type(obj)
    # the common cases of real libraries (allreduce of a number), written out
    if cls is float:
        _S_FLOAT.pack_into(out, 0, FLOAT, m, 0, obj)
        return Encoded(out)
    if cls is int and -0x8000000000000000 <= obj <= 0x7FFFFFFFFFFFFFFF:
        _ints(out, INT, m, 0, (obj,))
        return Encoded(out)
    try:
        if cls is tuple or cls is list:     # shapes, counts
            done = _sequence(obj, m, out, TUPLE if cls is tuple else LIST)
            if done is not None:
                return done
            return pickled(obj, m, out_of_band, out)
        enc = _ENCODERS.get(cls)
        if enc is not None:
            done = enc(obj, m, out)
            if done is not None:
                return done
        return pickled(obj, m, out_of_band, out)
    except Exception as exc:
        return failed(m, exc, out)


def encode_each(objs, n: int, m: int):
    """scatter's and alltoall's ``n`` objects: (int64 table of n headers, their parts,
    the error or None).  The rounds of every header are the most parts any of them has,
    so that every receiver learns how many rounds follow.  The same object given for
    several destinations is encoded once."""
    table = np.zeros((n, WORDS), np.int64)
    try:
        items = [None] * n if objs is None else list(objs)
        if len(items) != n:
            raise ValueError(f"expecting {n} items, got {len(items)}")
    except Exception as exc:
        table[:] = failed(m, exc).header
        return table, [()] * n, exc
    seen: dict = {}
    parts = []
    for i, obj in enumerate(items):
        enc = seen.get(id(obj))
        if enc is None:
            enc = seen[id(obj)] = encode(obj, m, False, table[i])
            if enc.error is not None:
                table[:] = enc.header.copy()
                return table, [()] * n, enc.error
        else:
            table[i] = enc.header
        parts.append(enc.parts)
    low = table[:, 0] & ((1 << _ROUNDS_SHIFT) - 1)
    table[:, 0] = low | (table[:, 0] >> _ROUNDS_SHIFT).max() << _ROUNDS_SHIFT
    return table, parts, None


# -- the gathered headers -------------------------------------------------------------------

class Rows:
    """Reads n gathered headers where they hold the lowercase methods' common case: a
    number, or a tuple or list of ints, of one kind and length on every row (read in
    place, without turning every word into a Python int).  One per header receive buffer
    ``recv`` (int64, n rows of WORDS): its words as int64 and as float64, viewed once (in
    the compiled form, typed views: each word read is one load)."""

    def __init__(self, n: int, recv):
        self.n = n
        raw = memoryview(recv).cast("B")
        self.w = raw.cast("q")
        self.f = raw.cast("d")

    def read(self, m: int) -> tuple:
        """(agreed, values) of the headers in the receive buffer: whether every row's call
        is ``m`` (``meta``); where it is, the rows' objects in the common case, else None."""
        n, words = self.n, WORDS
        for i in range(n):
            if self.w[i * words + 1] != m:
                return False, None
        w0 = self.w[0]
        for i in range(1, n):
            if self.w[i * words] != w0:
                return True, None
        if w0 == FLOAT:
            return True, [self.f[i * words + 3] for i in range(n)]
        if w0 == INT:
            return True, [self.w[i * words + 3] for i in range(n)]
        kind = w0 & 0xFF
        if kind != TUPLE and kind != LIST:
            return True, None
        k = (w0 >> _AUX_SHIFT) & _AUX_MASK
        if k >= 0x10:                      # an element code: not ints only
            return True, None
        rows = []
        for i in range(n):
            b = i * words + 3
            row = [self.w[b + j] for j in range(k)]
            rows.append(tuple(row) if kind == TUPLE else row)
        return True, rows


class Table:
    """Headers of one call, one per row (from every rank, or a root's rows), read once
    into Python ints: every rank that holds the same rows takes the same decisions.  A
    copy: the receive buffer may take the next call's headers while these are read."""
    __slots__ = ("raw", "ints", "n", "extra")

    def __init__(self, raw: np.ndarray, n: int, ints=None):
        self.raw, self.n = raw.tobytes(), n
        self.ints = raw.tolist() if ints is None else ints
        self.extra = None        # lengths of out-of-band buffers past the inline ones

    def kind(self, i: int) -> int:
        return self.ints[WORDS * i] & 0xFF

    def rounds(self) -> int:
        """How many rounds of parts follow (the same on every rank that holds these rows)."""
        return max(self.ints[0::WORDS]) >> _ROUNDS_SHIFT

    def own(self, i: int) -> int:
        """Parts of row i's object (its rounds may be its sender's most, for alltoall)."""
        kind = self.kind(i)
        if kind == ARRAY:
            return 1
        return 1 + self.nbuf(i) if kind == PICKLED else 0

    def nbuf(self, i: int) -> int:
        w = self.ints[WORDS * i]
        return (w >> _AUX_SHIFT) & _AUX_MASK if w & 0xFF == PICKLED else 0

    def overflow(self) -> list:
        """Per row, how many out-of-band lengths the header could not hold."""
        return [max(0, self.nbuf(i) - INLINE) for i in range(self.n)]

    def length(self, i: int, k: int) -> int:
        """Bytes of row i's part k (0 where it has none)."""
        if k >= self.own(i):
            return 0
        if k == 0:
            return self.ints[WORDS * i + 2]
        if k <= INLINE:
            return self.ints[WORDS * i + 2 + k]
        return self.extra[i][k - 1 - INLINE]

    # -- agreement ----------------------------------------------------------------------
    def check(self, names: dict, mine: int, rows_of=None) -> None:
        """Raise CollectiveMismatch if a row was sent by another method or with another
        root or op than ``mine`` (``meta(method, root, op)``); every rank holding these
        rows raises it alike.  Then raise if a sender could not encode its object."""
        ints, n = self.ints, self.n
        calls = ints[1::WORDS]
        if calls.count(mine) == n:
            return
        calls = [c & ~_FAILED_CALL for c in calls]
        if any(c != mine for c in calls):
            def say(c):
                method, root, op = c & 0xFF, (c >> 8) & 0xFFFFFFFF, c >> _OP_SHIFT
                name = names.get(method, f"method {method}")
                args = ([f"root={root}"] if name in ROOTED else []) + \
                    ([f"op={_op_name(op)}"] if op else [])
                return f"{name}({', '.join(args)})" if args else name
            ranks = [i if rows_of is None else rows_of for i in range(n)]
            odd = sorted({r for r, c in zip(ranks, calls) if c != mine})
            fields = {"collective": {r: say(c) for r, c in zip(ranks, calls)}}
            text = ", ".join(f"rank {r}: {say(c)}" for r, c in sorted(set(zip(ranks, calls))))
            raise CollectiveMismatch(f"ranks disagree about a lowercase collective on one "
                                     f"communicator, expected {say(mine)} ({text})",
                                     ranks=odd, fields=fields)
        bad = [i for i in range(n) if ints[WORDS * i] & 0xFF == FAILED]
        if bad:
            who = bad if rows_of is None else [rows_of]
            raise HpcCollError(f"rank{'s' if len(who) > 1 else ''} "
                               f"{', '.join(map(str, who))} could not send its object "
                               "(that rank raised the error)")

    # -- values ---------------------------------------------------------------------------
    def value(self, i: int, parts=()):
        """Row i's object, from the header alone or from its received ``parts``."""
        base = WORDS * i
        w = self.ints[base]
        kind = w & 0xFF
        if kind == INT:
            return self.ints[base + 3]
        if kind == FLOAT:
            return self._float(base + 3)
        if kind == NONE:
            return None
        aux = (w >> _AUX_SHIFT) & _AUX_MASK
        if kind == BOOL:
            return self.ints[base + 3] != 0
        if kind == TUPLE or kind == LIST:
            items = self._items(base, aux)
            return tuple(items) if kind == TUPLE else items
        if kind == COMPLEX:
            return complex(self._float(base + 3), self._float(base + 4))
        if kind == STR or kind == RAW or kind == SMALL_PICKLE:
            start = 8 * (base + 3)
            data = self.raw[start:start + aux]
            if kind == SMALL_PICKLE:
                return MPI.pickle.loads(data)
            return data.decode() if kind == STR else data
        if kind == NPSCALAR:
            dt = _DTYPES[aux]
            start = 8 * (base + 3)
            return np.frombuffer(self.raw, dt, 1, start)[0]
        if kind == ARRAY:
            dt = _DTYPES[aux & 0x1F]
            ndim, order = (aux >> 5) & MAX_NDIM, "F" if aux >> 8 & 1 else "C"
            shape = self.ints[base + 3:base + 3 + ndim]
            return parts[0].view(dt).reshape(shape, order=order)
        if kind == PICKLED:
            if len(parts) == 1:
                return MPI.pickle.loads(parts[0])
            return MPI.pickle.loads_oob(parts[0], list(parts[1:]))
        raise HpcCollError(f"object header of kind {kind}: not one this version sends "
                           "(ranks running different hpccoll versions?)")

    def _float(self, word: int) -> float:
        return _DOUBLE.unpack_from(self.raw, 8 * word)[0]

    def _items(self, base: int, aux: int) -> list:
        if aux < 0x10:          # ints only
            return self.ints[base + 3:base + 3 + aux]
        out = []
        for j in range(aux & 0xF):
            code = (aux >> (4 + 2 * j)) & 0x3
            word = base + 3 + j
            if code == _E_INT:
                out.append(self.ints[word])
            elif code == _E_FLOAT:
                out.append(self._float(word))
            elif code == _E_BOOL:
                out.append(self.ints[word] != 0)
            else:
                out.append(None)
        return out


ROOTED = {"bcast", "gather", "scatter", "reduce"}


def aligned(counts) -> tuple:
    """(displacements, total) for blocks of ``counts`` bytes, each starting on 64
    bytes: arrays decoded in place are aligned to their dtype."""
    displs, at = [], 0
    for c in counts:
        displs.append(at)
        at += (c + 63) & ~63
    return displs, at


def own_copy(enc: Encoded) -> list:
    """The sender's own parts, copied: what its decoded result may be made of (mpi4py's
    root gets a new object too, never its argument)."""
    return [p.copy() for p in enc.parts]


EMPTY = _EMPTY
