"""What goes into the app's classes.dex, and what must not be reachable in it.

* :func:`needed_classes`: the classes of a library jar (kotlin-stdlib) that the app's own jars name,
  transitively (class references, descriptors and class names in strings, which covers the stdlib's
  own ``Class.forName`` lookups); only those are dexed.
* :func:`read_dex` and :func:`reachable_call_sites`: a DEX file's classes and code, and every
  ``invoke-custom`` / ``invoke-polymorphic`` in a method that code outside the given prefixes can
  reach. Android's libcore has no ``LambdaMetafactory``: an ``invoke-custom`` made from a Java or
  Kotlin lambda fails when it first runs, so the app's own code and the switcher library must never
  reach one. The reachability is a rapid type analysis that errs towards reaching more: every method
  of a root class is live, a virtual or interface call reaches each override in a class instantiated
  by live code, an instantiated class's virtual methods that no class of the DEX above it declares are
  live when the framework may call them (Object's methods; any, below a framework type other than
  Object and marker interfaces: Iterator, Comparator, Runnable, AbstractList...), and a
  class referenced in any way has its static initialiser live.
"""

from __future__ import annotations

import functools
import re
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

# -- class files ---------------------------------------------------------------------------------

_CLASS_IN_TEXT = re.compile(rb"L([A-Za-z_$][\w$/]*);")


def _constant_pool(data: bytes) -> Tuple[List[bytes], List[int], bool]:
    """A class file's UTF-8 constants, the indices its CONSTANT_Class entries point at, and whether it
    has an invokedynamic constant."""
    count = struct.unpack_from(">H", data, 8)[0]
    utf8: Dict[int, bytes] = {}
    class_refs: List[int] = []
    indy = False
    i, k = 10, 1
    while k < count:
        tag = data[i]
        if tag == 1:
            n = struct.unpack_from(">H", data, i + 1)[0]
            utf8[k] = data[i + 3:i + 3 + n]
            i += 3 + n
        elif tag == 7:
            class_refs.append(struct.unpack_from(">H", data, i + 1)[0])
            i += 3
        elif tag in (3, 4, 9, 10, 11, 12, 17, 18):
            indy = indy or tag == 18
            i += 5
        elif tag in (5, 6):
            i += 9
            k += 1
        elif tag in (8, 16, 19, 20):
            i += 3
        elif tag == 15:
            i += 4
        else:
            raise ValueError(f"constant pool tag {tag} at byte {i}")
        k += 1
    return list(utf8.values()), class_refs, indy


def class_names(data: bytes) -> Set[str]:
    """Every class a class file names: its Class constants, the types in its descriptors and signatures,
    and dotted class names in its strings."""
    utf8, _, _ = _constant_pool(data)
    names: Set[str] = set()
    for text in utf8:
        if b"/" in text and b";" not in text and b" " not in text and b"(" not in text:
            names.add(text.decode("utf-8", "replace"))  # a CONSTANT_Class name such as kotlin/Unit
        for m in _CLASS_IN_TEXT.finditer(text):
            names.add(m.group(1).decode("utf-8", "replace"))
        if b"." in text and b" " not in text and b"/" not in text:
            names.add(text.decode("utf-8", "replace").replace(".", "/"))  # Class.forName("kotlin.internal...")
    return {n.lstrip("[") for n in names}


def jar_classes(jar: Path) -> Dict[str, bytes]:
    """A jar's Java 8 classes by internal name (META-INF/versions/ and module-info left out)."""
    out: Dict[str, bytes] = {}
    with zipfile.ZipFile(jar) as z:
        for name in z.namelist():
            if name.endswith(".class") and not name.startswith("META-INF/") and name != "module-info.class":
                out[name[:-len(".class")]] = z.read(name)
    return out


def needed_classes(roots: Iterable[bytes], library: Dict[str, bytes]) -> Set[str]:
    """The classes of ``library`` that ``roots`` name, and those they name, transitively."""
    todo = [n for data in roots for n in class_names(data)]
    seen: Set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in library:
            continue
        seen.add(name)
        todo.extend(class_names(library[name]))
        outer = name.rsplit("$", 1)[0]  # an inner class's outer class (InnerClasses attributes name it too)
        if outer != name:
            todo.append(outer)
    return seen


def write_jar(classes: Dict[str, bytes], keep: Set[str], out: Path) -> Path:
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name in sorted(keep):
            z.writestr(name + ".class", classes[name])
    return out


# -- dex files -----------------------------------------------------------------------------------

INVOKE_POLYMORPHIC, INVOKE_POLYMORPHIC_RANGE, INVOKE_CUSTOM, INVOKE_CUSTOM_RANGE = 0xFA, 0xFB, 0xFC, 0xFD
OPCODE_NAMES = {0xFA: "invoke-polymorphic", 0xFB: "invoke-polymorphic/range", 0xFC: "invoke-custom",
                0xFD: "invoke-custom/range"}


def _width(op: int) -> int:
    """An instruction's length in 16-bit code units, by opcode (the Dalvik formats)."""
    if op in (0x02, 0x05, 0x08, 0x13, 0x15, 0x16, 0x19, 0x1A, 0x1C, 0x1F, 0x20, 0x22, 0x23, 0x29, 0xFE, 0xFF):
        return 2
    if op in (0x03, 0x06, 0x09, 0x14, 0x17, 0x1B, 0x24, 0x25, 0x26, 0x2A, 0x2B, 0x2C, 0xFC, 0xFD):
        return 3
    if op == 0x18:
        return 5
    if op in (0xFA, 0xFB):
        return 4
    if 0x2D <= op <= 0x3D or 0x44 <= op <= 0x6D or 0x90 <= op <= 0xAF or 0xD0 <= op <= 0xE2:
        return 2
    if 0x6E <= op <= 0x72 or 0x74 <= op <= 0x78:
        return 3
    return 1


def _uleb(data: bytes, i: int) -> Tuple[int, int]:
    value = shift = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


@dataclass
class DexMethod:
    key: Tuple[str, str, str]  # (class descriptor, name, prototype)
    virtual: bool
    code: Optional[Tuple[int, int]]  # (byte offset of insns, code units)


@dataclass
class DexClass:
    name: str
    superclass: Optional[str]
    interfaces: List[str]
    methods: Dict[Tuple[str, str], DexMethod] = field(default_factory=dict)


@dataclass
class Dex:
    data: bytes
    types: List[str]
    methods: List[Tuple[str, str, str]]  # method_ids: (class, name, prototype)
    fields: List[str]  # field_ids: the class
    classes: Dict[str, DexClass]
    call_site_ids: int  # the map's call_site_id_item count

    def instructions(self, method: DexMethod) -> Iterable[Tuple[int, int]]:
        """(opcode, the index in its second code unit) for each instruction of ``method``."""
        if method.code is None:
            return
        start, units = method.code
        d = self.data
        pc = 0
        while pc < units:
            unit = struct.unpack_from("<H", d, start + 2 * pc)[0]
            op = unit & 0xFF
            if op == 0 and unit >> 8 in (1, 2, 3):  # switch and array-data payloads
                size = struct.unpack_from("<H", d, start + 2 * pc + 2)[0]
                if unit >> 8 == 1:
                    pc += 4 + size * 2
                elif unit >> 8 == 2:
                    pc += 2 + size * 4
                else:
                    count = struct.unpack_from("<I", d, start + 2 * pc + 4)[0]
                    pc += 4 + (size * count + 1) // 2
                continue
            index = struct.unpack_from("<H", d, start + 2 * pc + 2)[0] if pc + 1 < units else 0
            yield op, index
            pc += _width(op)


def read_dex(data: bytes) -> Dex:
    if data[:4] != b"dex\n":
        raise ValueError("not a DEX file")
    u32 = lambda off: struct.unpack_from("<I", data, off)[0]  # noqa: E731

    def string(i: int) -> str:
        off = u32(u32(60) + 4 * i)
        _, off = _uleb(data, off)
        end = data.index(b"\0", off)
        return data[off:end].decode("utf-8", "replace")

    types = [string(u32(u32(68) + 4 * i)) for i in range(u32(64))]

    def type_list(off: int) -> List[str]:
        if off == 0:
            return []
        return [types[struct.unpack_from("<H", data, off + 4 + 2 * j)[0]] for j in range(u32(off))]

    protos = []
    for i in range(u32(72)):
        base = u32(76) + 12 * i
        protos.append("(" + "".join(type_list(u32(base + 8))) + ")" + types[u32(base + 4)])
    methods = []
    for i in range(u32(88)):
        base = u32(92) + 8 * i
        cls, proto = struct.unpack_from("<HH", data, base)
        methods.append((types[cls], string(u32(base + 4)), protos[proto]))
    fields = [types[struct.unpack_from("<H", data, u32(84) + 8 * i)[0]] for i in range(u32(80))]
    classes: Dict[str, DexClass] = {}
    for i in range(u32(96)):
        base = u32(100) + 32 * i
        sup = u32(base + 8)
        c = DexClass(types[u32(base)], None if sup == 0xFFFFFFFF else types[sup], type_list(u32(base + 12)))
        off = u32(base + 24)
        if off:
            sizes = []
            for _ in range(4):
                n, off = _uleb(data, off)
                sizes.append(n)
            for _ in range(sizes[0] + sizes[1]):
                _, off = _uleb(data, off)
                _, off = _uleb(data, off)
            for kind in (2, 3):
                idx = 0
                for _ in range(sizes[kind]):
                    diff, off = _uleb(data, off)
                    _, off = _uleb(data, off)
                    code, off = _uleb(data, off)
                    idx += diff
                    key = methods[idx]
                    c.methods[(key[1], key[2])] = DexMethod(key, kind == 3, (code + 16, u32(code + 12)) if code else None)
        classes[c.name] = c
    call_sites = 0
    map_off = u32(52)
    for j in range(u32(map_off)):
        kind, _, size = struct.unpack_from("<HHI", data, map_off + 4 + 12 * j)
        if kind == 0x0007:
            call_sites = size
    return Dex(data, types, methods, fields, classes, call_sites)


def call_sites(dex: Dex) -> List[Tuple[Tuple[str, str, str], str]]:
    """Every invoke-custom / invoke-polymorphic in the DEX: (method, instruction)."""
    return [(m.key, OPCODE_NAMES[op]) for c in dex.classes.values() for m in c.methods.values()
            for op, _ in dex.instructions(m) if op in OPCODE_NAMES]


_NO_METHODS = {"Ljava/lang/Object;", "Ljava/io/Serializable;", "Ljava/lang/Cloneable;", "Ljava/util/RandomAccess;"}
_OBJECT_METHODS = {("toString", "()Ljava/lang/String;"), ("hashCode", "()I"), ("equals", "(Ljava/lang/Object;)Z"),
                   ("finalize", "()V"), ("clone", "()Ljava/lang/Object;")}


def reachable_call_sites(dex: Dex, library: Sequence[str] = ("Lkotlin/",),
                         parents: Optional[Dict[Tuple[str, str, str], Optional[Tuple[str, str, str]]]] = None,
                         ) -> List[Tuple[Tuple[str, str, str], str]]:
    """The invoke-custom / invoke-polymorphic instructions in methods live from every class outside the
    ``library`` prefixes (the app, the switcher library, ExecuTorch and fbjni are all taken as live).
    ``parents``, when given, receives for each live method the one that made it live (None: a root)."""
    classes = dex.classes
    if parents is None:
        parents = {}

    @functools.lru_cache(maxsize=None)
    def supertypes(name: str) -> Tuple[str, ...]:
        out: List[str] = []
        todo = [name]
        while todo:
            n = todo.pop()
            if n in out:
                continue
            out.append(n)
            c = classes.get(n)
            if c is not None:
                todo += ([c.superclass] if c.superclass else []) + c.interfaces
        return tuple(out)

    live: Set[Tuple[str, str, str]] = set()
    instantiated: Set[str] = set()
    referenced: Set[str] = set()
    virtual_calls: Set[Tuple[str, str, str]] = set()
    todo: List[DexMethod] = []
    current: List[Optional[Tuple[str, str, str]]] = [None]

    def mark(m: Optional[DexMethod]) -> None:
        if m is not None and m.key not in live:
            live.add(m.key)
            parents[m.key] = current[0]
            todo.append(m)

    def resolve(cls: str, name: str, proto: str) -> Optional[DexMethod]:
        for t in supertypes(cls):
            c = classes.get(t)
            if c is not None and (name, proto) in c.methods:
                return c.methods[(name, proto)]
        return None

    def reference(cls: str) -> None:
        for t in supertypes(cls):
            if t not in referenced:
                referenced.add(t)
                c = classes.get(t)
                if c is not None:
                    mark(c.methods.get(("<clinit>", "()V")))

    def instantiate(cls: str) -> None:
        if cls in instantiated:
            return
        instantiated.add(cls)
        reference(cls)
        for t in supertypes(cls):
            c = classes.get(t)
            if c is None:
                continue
            above = [classes[s] for s in supertypes(t)[1:] if s in classes]
            # what the framework may call on it: Object's methods, or anything when a framework type
            # above it (Iterator, Comparator, Runnable, AbstractList...) could declare it
            only_object = all(s in classes or s in _NO_METHODS for s in supertypes(t))
            for (name, proto), m in c.methods.items():
                # first declared here (no class of the DEX above declares it) and callable by the framework
                if m.virtual and not any((name, proto) in s.methods for s in above) and (
                        not only_object or (name, proto) in _OBJECT_METHODS):
                    mark(m)

    for c in list(classes.values()):
        if not c.name.startswith(tuple(library)):
            instantiate(c.name)
            for m in c.methods.values():
                mark(m)
    while todo:
        m = todo.pop()
        current[0] = m.key
        for op, index in dex.instructions(m):
            if 0x6E <= op <= 0x72 or 0x74 <= op <= 0x78 or op in (0xFA, 0xFB):
                cls, name, proto = dex.methods[index]
                reference(cls)
                mark(resolve(cls, name, proto))
                if op in (0x6E, 0x72, 0x74, 0x78) and (cls, name, proto) not in virtual_calls:
                    virtual_calls.add((cls, name, proto))
                    for t in list(instantiated):
                        if cls in supertypes(t):
                            mark(resolve(t, name, proto))
            elif op in (0x22, 0x1C, 0x1F, 0x20, 0x23, 0x24, 0x25) and index < len(dex.types):
                t = dex.types[index].lstrip("[")
                if op == 0x22:
                    before = set(instantiated)
                    instantiate(t)
                    for new in instantiated - before:
                        for cls, name, proto in list(virtual_calls):
                            if cls in supertypes(new):
                                mark(resolve(new, name, proto))
                elif t.startswith("L"):
                    reference(t)
            elif 0x60 <= op <= 0x6D:
                reference(dex.fields[index])
    out = []
    for c in classes.values():
        for m in c.methods.values():
            if m.key in live:
                out += [(m.key, OPCODE_NAMES[op]) for op, _ in dex.instructions(m) if op in OPCODE_NAMES]
    return out


def path_to(parents: Dict[Tuple[str, str, str], Optional[Tuple[str, str, str]]], key: Tuple[str, str, str]) -> List[str]:
    """How a live method was reached: root first, as ``Class.name``."""
    chain = []
    seen = set()
    k: Optional[Tuple[str, str, str]] = key
    while k is not None and k not in seen:
        seen.add(k)
        chain.append(f"{k[0][1:-1]}.{k[1]}")
        k = parents.get(k)
    return chain[::-1]
