"""A bounded reader for the header of a GGUF file a user (or an attacker) hands the app.

Every count, length, offset and dimension is checked against the file's size and a few limits before anything is
built from it, so no header can make reading it hang, recurse without end or allocate more than a bounded amount:
gguf's own reader (which transformers uses) walks an array item by item without checking the count against the
file, recurses into arrays of arrays and multiplies tensor dimensions in wrapping uint64. It is run only on headers
this reader accepted. Raises CorruptModelFile for anything it refuses.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from .errors import CorruptModelFile

MAX_KEYS = 1 << 16
MAX_TENSORS = 1 << 16
MAX_ARRAY_ITEMS = 1 << 19
"""Items of one array (Qwen2.5's vocabulary: 152,064 tokens, as many merges)."""
MAX_TOTAL_ARRAY_ITEMS = 1 << 20
"""gguf's reader builds two numpy arrays per item (about 1.3 kB each, measured): this bounds it to about 1.3 GB."""
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_STORED_STRING = 4096
"""String values longer than this are checked and skipped, not kept (a chat template, not a name)."""
ARRAY, STRING = 9, 8
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    type: int
    elements: int
    start: int
    """Absolute offset of its data in the file."""
    n_bytes: int


@dataclass
class GgufHeader:
    fields: dict[str, object]
    """Scalars and short strings by key; an array by its item count."""
    tensors: list[TensorInfo]

    @property
    def elements(self) -> int:
        return sum(t.elements for t in self.tensors)


class _Cursor:
    def __init__(self, buf, size: int, name: str):
        self.buf, self.size, self.name, self.pos, self.order = buf, size, name, 0, "<"
        self.items_left = MAX_TOTAL_ARRAY_ITEMS

    def fail(self, what: str) -> CorruptModelFile:
        return CorruptModelFile(f"{self.name} is not a valid GGUF file or is truncated ({what}).")

    def take(self, n: int, what: str) -> int:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"{what} at byte {self.pos:,} runs past the end of the file ({self.size:,} bytes)")
        start, self.pos = self.pos, self.pos + n
        return start

    def scalar(self, code: str, what: str):
        start = self.take(struct.calcsize(code), what)
        return struct.unpack_from(self.order + code, self.buf, start)[0]

    def string(self, what: str, keep: bool = True) -> str | None:
        length = self.scalar("Q", f"the length of {what}")
        start = self.take(length, f"{what} ({length:,} bytes)")
        if not keep or length > MAX_STORED_STRING:
            return None
        try:
            return bytes(self.buf[start:start + length]).decode("utf-8")
        except UnicodeDecodeError as err:
            raise self.fail(f"{what} is not UTF-8") from err


def _value(cur: _Cursor, vtype: int, key: str):
    if vtype in SCALARS:
        return cur.scalar(SCALARS[vtype], f"the value of {key}")
    if vtype == STRING:
        return cur.string(f"the value of {key}")
    if vtype != ARRAY:
        raise cur.fail(f"{key} has the unknown value type {vtype}")
    itype = cur.scalar("I", f"the item type of {key}")
    count = cur.scalar("Q", f"the length of {key}")
    if itype == ARRAY:
        raise cur.fail(f"{key} is an array of arrays")
    if count > MAX_ARRAY_ITEMS or count > cur.items_left:
        raise cur.fail(f"{key} declares {count:,} items, more than a Qwen2 model file holds")
    cur.items_left -= count
    if itype in SCALARS:
        cur.take(count * struct.calcsize(SCALARS[itype]), f"the {count:,} items of {key}")
    elif itype == STRING:
        for _ in range(count):
            cur.string(f"an item of {key}", keep=False)
    else:
        raise cur.fail(f"{key} has the unknown item type {itype}")
    return count


def _tensor(cur: _Cursor, known_types: set[int]) -> tuple[str, tuple[int, ...], int, int]:
    name = cur.string("a tensor name")
    if name is None:
        raise cur.fail("a tensor name is longer than any real one")
    n_dims = cur.scalar("I", f"the dimension count of {name}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cur.fail(f"tensor {name} has {n_dims:,} dimensions")
    shape = tuple(cur.scalar("Q", f"a dimension of {name}") for _ in range(n_dims))
    ttype = cur.scalar("I", f"the type of {name}")
    offset = cur.scalar("Q", f"the offset of {name}")
    if ttype not in known_types:
        raise cur.fail(f"tensor {name} has the unknown type {ttype}")
    return name, shape, ttype, offset


def read_header(path: Path) -> GgufHeader:
    """The checked header of the GGUF file at `path` (see the module docstring)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 24:
                raise CorruptModelFile(f"{path.name} is not a valid GGUF file or is truncated (only {size} bytes long).")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(_Cursor(buf, size, path.name), GGML_QUANT_SIZES, GGMLQuantizationType)
    except OSError as err:
        raise CorruptModelFile(f"{path.name} could not be read ({err}).") from err


def _parse(cur: _Cursor, quant_sizes, quant_type) -> GgufHeader:
    if bytes(cur.buf[:4]) != b"GGUF":
        raise CorruptModelFile(f"{cur.name} is not a valid GGUF file (its first bytes are not 'GGUF').")
    cur.pos = 4
    version = struct.unpack_from("<I", cur.buf, 4)[0]
    if version & 0xFFFF == 0:  # written on a machine of the other byte order, as gguf's reader reads it
        cur.order, version = ">", struct.unpack_from(">I", cur.buf, 4)[0]
    cur.pos = 8
    if version not in (2, 3):
        raise CorruptModelFile(f"{cur.name} is not a valid GGUF file (version {version}; versions 2 and 3 are read).")
    n_tensors = cur.scalar("Q", "the tensor count")
    n_keys = cur.scalar("Q", "the key count")
    if n_tensors > MAX_TENSORS or n_keys > MAX_KEYS:
        raise cur.fail(f"it declares {n_tensors:,} tensors and {n_keys:,} keys")
    fields: dict[str, object] = {}
    for _ in range(n_keys):
        key = cur.string("a key name")
        if key is None or key in fields:
            raise cur.fail(f"a key is too long or repeated ({key!r})")
        fields[key] = _value(cur, cur.scalar("I", f"the type of {key}"), key)
    known_types = {int(t) for t in quant_sizes}
    infos = [_tensor(cur, known_types) for _ in range(n_tensors)]
    if len({name for name, *_ in infos}) != len(infos):
        raise cur.fail("two tensors have the same name")
    alignment = fields.get("general.alignment", 32)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise cur.fail(f"general.alignment is {alignment!r}, not a power of two")
    data_start = -(-cur.pos // alignment) * alignment
    tensors = []
    for name, shape, ttype, offset in infos:
        block, type_size = quant_sizes[quant_type(ttype)]
        elements = 1
        for d in shape:
            elements *= d
        if shape[0] % block:
            raise cur.fail(f"tensor {name}'s rows of {shape[0]:,} are not whole blocks of {block}")
        n_bytes = elements // block * type_size
        start = data_start + offset
        if start + n_bytes > cur.size:
            raise CorruptModelFile(f"{cur.name} is truncated: tensor {name} extends past the end of the file.")
        tensors.append(TensorInfo(name, shape, ttype, elements, start, n_bytes))
    return GgufHeader(fields, tensors)


def declared_params(header: GgufHeader, name: str) -> int:
    """The parameter count of the Qwen2 model the header's hyperparameters describe: what transformers allocates
    when it builds the model from them. Refuses hyperparameters that are missing (transformers would fill in a
    7B model's) or not positive whole numbers."""
    f = header.fields

    def dim(key: str, default: object = None) -> int:
        value = f.get(f"qwen2.{key}", default)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**31:
            raise CorruptModelFile(f"{name} is not a usable Qwen2 model: its header has no valid qwen2.{key} "
                                   f"(found {value!r}).")
        return value

    hidden, layers, inter, heads = (dim(k) for k in ("embedding_length", "block_count", "feed_forward_length",
                                                     "attention.head_count"))
    kv_heads = dim("attention.head_count_kv", heads)
    vocab = dim("vocab_size", f.get("tokenizer.ggml.tokens", 151936))  # else transformers counts the tokens
    head_dim = max(hidden // heads, 1)
    attention = 2 * hidden * heads * head_dim + heads * head_dim + 2 * (hidden + 1) * kv_heads * head_dim
    per_layer = attention + 3 * hidden * inter + 2 * hidden
    tied = all(t.name != "output.weight" for t in header.tensors)
    return layers * per_layer + vocab * hidden * (1 if tied else 2) + hidden


def check_weights_cover_model(header: GgufHeader, name: str) -> int:
    """Refuse a file whose hyperparameters describe a larger model than the weights it holds (transformers would
    allocate the rest); return the parameter count."""
    params = declared_params(header, name)
    if params > header.elements:
        raise CorruptModelFile(f"{name} is not a usable Qwen2 model: its header describes {params:,} parameters but "
                               f"the file holds only {header.elements:,} weights.")
    return params
