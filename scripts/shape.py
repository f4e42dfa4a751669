#!/usr/bin/env python3
"""The tree's shape, checked (issues 28, 47 and 69): no function outside tests
longer than MAX lines, no source file longer than MAX_FILE lines outside
its tests, no import cycle in any crate, between its files or between its
top-level modules, and every exhaustive `match` on a link kind in one of the
places docs/ARCHITECTURE.md lists under "Adding a link kind" (at most
MAX_PLACES). Files over MARGIN_FILE lines and functions over MARGIN lines are
named in the report (the caps' margin), without failing it.

Usage: scripts/shape.py [--top N]   (exit 1 on a violation)
Its own tests: scripts/test_shape.py (a probe cycle between two files, and
through `super::` and a re-export, each found).

Functions are found by their `fn` line and the matching close brace (string
and char literals and comments skipped); `#[cfg(test)]` modules (inline, or
in a module's `tests.rs`) and `tests/`, `benches/` and `fuzz/` are not counted.
How imports are found: see "The import graph" below."""
import os, re, sys

MAX = 100
MAX_FILE = 1000
MAX_PLACES = 5
MARGIN = 80
MARGIN_FILE = 800
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def strip(src):
    """`src` with comments and string/char literal contents blanked (newlines kept)."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i)); i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", src[i:j])); i = j
        elif c == "r" and re.match(r'r#*"', src[i:i + 10]) and not (i and (src[i-1].isalnum() or src[i-1] == "_")):
            m = re.match(r'r(#*)"', src[i:])
            end = '"' + m.group(1)
            j = src.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", src[i:j])); i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", src[i:j + 1])); i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'|'\\x[0-9a-fA-F]{2}'", src[i:i + 12]):
            m = re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'|'\\x[0-9a-fA-F]{2}'", src[i:i + 12])
            out.append(" " * len(m.group(0))); i += len(m.group(0))
        else:
            out.append(c); i += 1
    return "".join(out)


def block_end(s, open_at):
    depth = 0
    for j in range(open_at, len(s)):
        if s[j] == "{":
            depth += 1
        elif s[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(s) - 1


def without_tests(path):
    """The file, stripped, with its #[cfg(test)] modules blanked."""
    s = strip(read(path))
    for m in list(re.finditer(r"#\[cfg\(test\)\]\s*(pub(\(\w+\))?\s+)?mod\s+\w+\s*\{", s))[::-1]:
        e = block_end(s, m.end() - 1)
        s = s[:m.start()] + re.sub(r"[^\n]", " ", s[m.start():e + 1]) + s[e + 1:]
    return s


def functions(path):
    s = without_tests(path)
    for m in re.finditer(r"\bfn\s+(\w+)[^;{]*\{", s):
        # A signature holds no `{` but a where clause's; skip fn pointers in types.
        e = block_end(s, m.end() - 1)
        first = s.count("\n", 0, m.start()) + 1
        last = s.count("\n", 0, e) + 1
        yield m.group(1), first, last - first + 1


def code_lines(path):
    """Lines of `path` outside its tests (the blank tail of a test module
    at the end not counted)."""
    return len(without_tests(path).rstrip().split("\n"))


def test_file(path):
    """Whether `path` is a test module's file: declared `#[cfg(test)] mod
    NAME;` by its parent module (or under such a file)."""
    d, f = os.path.split(path)
    if f in ("lib.rs", "main.rs") or os.path.basename(d) == "bin":
        return False
    # A `#[path = "f.rs"]` declaration beside it.
    for g in os.listdir(d):
        if g.endswith(".rs") and g != f:
            for m in re.finditer(r"((?:#\[[^\]]*\]\s*)+)(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*;", read(os.path.join(d, g))):
                pa = re.search(r"#\[path\s*=\s*\"([^\"]*)\"\]", m.group(1))
                if pa and os.path.normpath(os.path.join(d, pa.group(1))) == os.path.normpath(path):
                    return "#[cfg(test)]" in m.group(1).replace(" ", "") or test_file(os.path.join(d, g))
    name, here = (os.path.basename(d), os.path.dirname(d)) if f == "mod.rs" else (f[:-3], d)
    parents = [os.path.join(here, x) for x in ("mod.rs", "lib.rs", "main.rs")] + [here + ".rs"]
    for parent in parents:
        if os.path.exists(parent):
            s = strip(read(parent))
            decl = re.search(r"((?:#\[[^\]]*\]\s*)*)(?:pub(?:\([^)]*\))?\s+)?mod\s+%s\s*;" % name, s)
            if decl:
                return "#[cfg(test)]" in decl.group(1).replace(" ", "") or test_file(parent)
    return False


def sources():
    """Every source file outside tests (`tests/`, `benches/`, a test
    module's own file), and each crate's build script."""
    for crate in sorted(os.listdir(os.path.join(ROOT, "crates"))):
        src = os.path.join(ROOT, "crates", crate, "src")
        for d, _, files in os.walk(src):
            for f in files:
                if f.endswith(".rs") and not test_file(os.path.join(d, f)):
                    yield os.path.relpath(os.path.join(d, f), ROOT)
        for extra in ("build.rs",):
            p = os.path.join(ROOT, "crates", crate, extra)
            if os.path.exists(p):
                yield os.path.relpath(p, ROOT)


# ---- The import graph, file by file -------------------------------------
#
# Each crate root (src/lib.rs, src/main.rs, src/bin/*.rs) is walked through
# its `mod NAME;` declarations (outside tests; `#[path]` followed) to a tree
# of modules, one file each. A file's imports are the paths it names: its
# `use` declarations (`pub use` re-exports excepted: they pass a name on and
# are followed, not counted) and every `a::b::c` path in its code, resolved
# as rustc resolves them: `crate::`, `self::` and `super::` from the module,
# a first word through the module's own names (child modules, items, its
# `use` names), then word by word through modules, re-exports (followed to
# the file that defines the item) and glob imports (`use x::*`: every word
# of the file that names one of x's items). An edge A -> B means file A
# names an item file B defines; a method call names no path and is not
# seen. A cycle is a strongly connected set of two or more files.

ITEM = re.compile(
    r"^[ \t]*(?:pub(?:\([^)]*\))?\s+)?(?:(?:unsafe|async|const|extern\s*\"?\w*\"?|default)\s+)*"
    r"(struct|enum|fn|trait|type|const|static|union|mod)\s+(\w+)", re.M)
USE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]*);")
MODDECL = re.compile(r"((?:#\[[^\]]*\]\s*)*)(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;")
PATH = re.compile(r"(?<![\w:])((?:\w+\s*::\s*)+\w+)")
WORD = re.compile(r"\b[A-Za-z_]\w*\b")


def depths(s):
    """The brace depth at each offset of `s` (stripped source)."""
    out, d = [0] * (len(s) + 1), 0
    for i, c in enumerate(s):
        if c == "{":
            d += 1
        out[i] = d
        if c == "}":
            d -= 1
    return out


def use_tree(text):
    """`a::{b, c::d as e, f::*}` -> [(["a","b"], "b", False), (["a","c","d"], "e", False),
    (["a","f"], None, True)]."""
    text = re.sub(r"\s+", "", text)
    out = []

    def walk(prefix, t):
        # split t at top-level commas
        parts, depth, cur = [], 0, ""
        for c in t:
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            if c == "," and depth == 0:
                parts.append(cur); cur = ""
            else:
                cur += c
        if cur:
            parts.append(cur)
        for p in parts:
            m = re.match(r"^((?:\w+::)*)\{(.*)\}$", p)
            if m:
                segs = [x for x in m.group(1).split("::") if x]
                walk(prefix + segs, m.group(2))
                continue
            segs = p.split("::")
            last = segs[-1]
            if last == "*":
                out.append((prefix + segs[:-1], None, True))
            elif last == "self":
                full = prefix + segs[:-1]
                out.append((full, full[-1] if full else None, False))
            else:
                out.append((prefix + segs, segs[-1], False))
    walk([], text)
    return out


def parse_use(text):
    # Keep `as` recognisable before the spaces go.
    text = re.sub(r"\s+as\s+", " __as__ ", text)
    out = []
    for path, alias, glob in use_tree(text):
        if path and "__as__" in path[-1]:
            name, alias = path[-1].split("__as__")
            path = path[:-1] + [name]
        if path and path[-1] == "self":
            path = path[:-1]
            alias = path[-1] if path else None
        out.append((path, alias, glob))
    return out


class Module:
    def __init__(self, key, path, parent):
        self.key, self.path, self.parent = key, path, parent
        self.children = {}     # name -> Module
        self.items = set()     # names defined at the top of the file
        self.uses = {}         # name -> path (a `use`, `pub use` too), resolved lazily
        self.globs = []        # paths of `use x::*`
        self.body = ""         # the file outside tests and `use` declarations
        self.body_uses = []    # (path, glob) of private uses, for edges


def blank_cfg_test(s):
    """`s` with `#[cfg(test)]` items (a `use`, a `mod x;`) blanked too."""
    def repl(m):
        return re.sub(r"[^\n]", " ", m.group(0))
    s = re.sub(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?(?:use\s+[^;]*;|mod\s+\w+\s*;)", repl, s)
    return s


def module_tree(root_file):
    mods = {}

    def load(key, path, parent):
        m = Module(key, path, parent)
        mods[key] = m
        s = blank_cfg_test(without_tests(path))
        d = depths(s)
        for im in ITEM.finditer(s):
            if d[im.start(2)] == 0:
                m.items.add(im.group(2))
        for im in re.finditer(r"macro_rules!\s*(\w+)", s):
            m.items.add(im.group(1))
        body = s
        for um in USE.finditer(s):
            top = d[um.start()] == 0
            public = bool(um.group(1))
            for p, alias, glob in parse_use(um.group(2)):
                if top:
                    if glob:
                        m.globs.append(p)
                    elif alias and alias != "_":
                        m.uses[alias] = p
                if not public:
                    m.body_uses.append((p, glob))
        body = USE.sub(lambda x: re.sub(r"[^\n]", " ", x.group(0)), s)
        # Module declarations: children files.
        here = os.path.dirname(path)
        name = os.path.basename(path)
        own_dir = here if name in ("mod.rs", "lib.rs", "main.rs") or parent is None else os.path.join(here, name[:-3])
        for mm in MODDECL.finditer(s):
            if d[mm.start(2)] != 0:
                continue
            attrs, child = mm.group(1), mm.group(2)
            pa = re.search(r"#\[path\s*=\s*\"([^\"]*)\"\]", read(path)[mm.start():mm.end()])
            if pa:
                f = os.path.join(here, pa.group(1))
            else:
                f = os.path.join(own_dir, child + ".rs")
                if not os.path.exists(f):
                    f = os.path.join(own_dir, child, "mod.rs")
            if os.path.exists(f):
                m.items.discard(child)
                m.children[child] = load(key + (child,), f, m)
            body = body[:mm.start()] + re.sub(r"[^\n]", " ", body[mm.start():mm.end()]) + body[mm.end():]
        m.body = body
        return m

    root = load((), root_file, None)
    return root, mods


def resolver(root):
    """resolve(module, segments) -> ("mod", Module) | ("file", path) | None."""

    def lookup(m, name, seen):
        """`name` in module `m`'s namespace."""
        if name in m.children:
            return ("mod", m.children[name])
        if name in m.items:
            return ("file", m.path)
        if name in m.uses:
            key = (id(m), name)
            if key in seen:
                return None
            return resolve(m, m.uses[name], seen | {key})
        for g in m.globs:
            key = (id(m), "*", tuple(g))
            if key in seen:
                continue
            t = resolve(m, g, seen | {key})
            if t and t[0] == "mod":
                r = lookup(t[1], name, seen | {key})
                if r:
                    return r
        return None

    def resolve(m, segs, seen=frozenset()):
        if not segs:
            return None
        first, rest = segs[0], segs[1:]
        if first == "crate":
            cur = root
        elif first == "self":
            cur = m
        elif first == "super":
            cur = m.parent
            while rest and rest[0] == "super" and cur is not None:
                cur, rest = cur.parent, rest[1:]
            if cur is None:
                return None
        else:
            t = lookup(m, first, seen)
            if t is None or t[0] == "file":
                return t
            cur = t[1]
        for i, name in enumerate(rest):
            t = lookup(cur, name, seen)
            if t is None:
                return None
            if t[0] == "file":
                return t
            cur = t[1]
        return ("mod", cur)

    return resolve, lookup


def file_edges(root, mods):
    """{file: {file it names}} for one crate root's module tree."""
    resolve, lookup = resolver(root)
    edges = {m.path: set() for m in mods.values()}

    def add(m, t):
        if t and t[0] == "file" and t[1] != m.path:
            edges[m.path].add(t[1])

    for m in mods.values():
        words = None
        for p, glob in m.body_uses:
            t = resolve(m, p)
            if glob:
                if t and t[0] == "mod":
                    if words is None:
                        words = set(WORD.findall(m.body))
                    for w in words:
                        add(m, lookup(t[1], w, frozenset()))
                else:
                    add(m, t)   # `use Enum::*`
            else:
                add(m, t)
        for pm in PATH.finditer(m.body):
            segs = [x.strip() for x in pm.group(1).split("::")]
            add(m, resolve(m, segs))
    return edges


def crate_roots(crate):
    src = os.path.join(ROOT, "crates", crate, "src")
    out = [os.path.join(src, f) for f in ("lib.rs", "main.rs") if os.path.exists(os.path.join(src, f))]
    b = os.path.join(src, "bin")
    if os.path.isdir(b):
        for f in sorted(os.listdir(b)):
            p = os.path.join(b, f)
            if f.endswith(".rs"):
                out.append(p)
            elif os.path.exists(os.path.join(p, "main.rs")):
                out.append(os.path.join(p, "main.rs"))
    return out


def strongly_connected(edges):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1
        stack.append(v); on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def one_cycle(edges, comp):
    """A shortest cycle through the first file of `comp`, inside `comp`."""
    start, inside = comp[0], set(comp)
    prev, queue = {start: None}, [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges.get(v, ())):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1] + [start]
            if w in inside and w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def cycles(crate):
    """The import cycles of `crate`: [("files" | "modules", cycle, size of its
    strongly connected set)]; "modules" are its top-level modules (a file's
    edges counted for the module it is in; the crate root not a module)."""
    base = os.path.join(ROOT, "crates", crate, "src")
    found = []
    for r in crate_roots(crate):
        root, mods = module_tree(r)
        edges = file_edges(root, mods)
        rel = {p: os.path.relpath(p, base) for p in edges}
        top = {p: re.sub(r"\.rs$", "", rel[p].split(os.sep)[0]) for p in edges}
        tops = {}
        for a, bs in edges.items():
            for b in bs:
                if top[a] != top[b] and rel[a] != os.path.relpath(r, base) and rel[b] != os.path.relpath(r, base):
                    tops.setdefault(top[a], set()).add(top[b])
        for kind, graph, name in (("modules", tops, lambda m: m), ("files", edges, lambda p: rel[p])):
            for comp in strongly_connected(graph):
                c = ("%s" % kind, [name(x) for x in one_cycle(graph, comp)], len(comp))
                if c not in found:
                    found.append(c)
    return found


def kind_places():
    """Problems with where link kinds live: a file outside tests that names
    every `Transport` variant (an exhaustive match: where a new kind must
    go) outside the places ARCHITECTURE.md lists, or more than MAX_PLACES
    places listed."""
    t = strip(read(os.path.join(ROOT, "crates/vnet-control/src/transport.rs")))
    m = re.search(r"pub enum Transport \{(.*?)\n\}", t, re.S)
    variants = re.findall(r"^ {4}(\w+)\b", m.group(1), re.M) if m else []
    doc = read(os.path.join(ROOT, "docs/ARCHITECTURE.md"))
    section = doc.split("## Adding a link kind", 1)[-1].split("\n## ", 1)[0]
    places = re.findall(r"^\d+\. `([^`]+)`", section, re.M)
    out = []
    if not variants:
        out.append("no `pub enum Transport` in crates/vnet-control/src/transport.rs")
    if not places or len(places) > MAX_PLACES:
        out.append(f"docs/ARCHITECTURE.md lists {len(places)} places for a link kind (1 to {MAX_PLACES})")
    for p in sources():
        s = without_tests(os.path.join(ROOT, p))
        if variants and all(re.search(r"\bTransport::%s\b" % v, s) for v in variants):
            if not any(p == pl or (pl.endswith("/") and p.startswith(pl)) for pl in places):
                out.append(f"{p}: a match on every link kind outside the places docs/ARCHITECTURE.md lists")
    return out, places


def main():
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 10
    paths = list(sources())
    fns = [(n, p, first, length) for p in paths for n, first, length in functions(os.path.join(ROOT, p))]
    fns.sort(key=lambda f: -f[3])
    print(f"largest {top} functions outside tests:")
    for n, p, first, length in fns[:top]:
        print(f"  {length:4} lines  {p}:{first}  {n}")
    files = sorted(((code_lines(os.path.join(ROOT, p)), p) for p in paths), reverse=True)
    print(f"largest {top} files outside tests:")
    for n, p in files[:top]:
        print(f"  {n:5} lines  {p}")
    near_fns = [f for f in fns if MARGIN < f[3] <= MAX]
    near_files = [f for f in files if MARGIN_FILE < f[0] <= MAX_FILE]
    print(f"within the margin ({len(near_fns)} functions over {MARGIN} lines, {len(near_files)} files over {MARGIN_FILE}; the caps are {MAX} and {MAX_FILE}):")
    for n, p, first, length in near_fns:
        print(f"  margin: {p}:{first}: fn {n} is {length} lines")
    for n, p in near_files:
        print(f"  margin: {p}: {n} lines outside tests")
    long = [f for f in fns if f[3] > MAX]
    big = [f for f in files if f[0] > MAX_FILE]
    cyc = [(c, cy) for c in sorted(os.listdir(os.path.join(ROOT, "crates"))) for cy in cycles(c)]
    for c, (kind, cy, size) in cyc:
        more = f" (one of {size} {kind} in a cycle)" if size > len(cy) - 1 else ""
        print(f"import cycle between the {kind} of {c}: " + " -> ".join(cy) + more)
    for n, p, first, length in long:
        print(f"{p}:{first}: fn {n} is {length} lines, more than {MAX}")
    for n, p in big:
        print(f"{p}: {n} lines outside tests, more than {MAX_FILE}")
    kinds, places = kind_places()
    print(f"a link kind's places ({len(places)}): " + ", ".join(places))
    for k in kinds:
        print(k)
    sys.exit(1 if long or cyc or big or kinds else 0)


if __name__ == "__main__":
    main()
