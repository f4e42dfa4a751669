#!/usr/bin/env python3
"""The tree's shape, checked (issues 28 and 47): no function outside tests
longer than MAX lines, no source file longer than MAX_FILE lines outside
its tests, no import cycle between the top-level modules of any crate, and
every exhaustive `match` on a link kind in one of the places
docs/ARCHITECTURE.md lists under "Adding a link kind" (at most MAX_PLACES).

Usage: scripts/shape.py [--top N]   (exit 1 on a violation)

Functions are found by their `fn` line and the matching close brace (string
and char literals and comments skipped); `#[cfg(test)]` modules (inline, or
in a module's `tests.rs`) and `tests/`, `benches/` and `fuzz/` are not counted. A module's imports are
its `crate::NAME` paths and `crate::{NAME, ...}` groups (NAME a top-level
module of its crate), outside its tests."""
import os, re, sys

MAX = 100
MAX_FILE = 1000
MAX_PLACES = 5
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


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
    s = strip(open(path, encoding="utf-8").read())
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


def sources():
    for crate in sorted(os.listdir(os.path.join(ROOT, "crates"))):
        src = os.path.join(ROOT, "crates", crate, "src")
        for d, _, files in os.walk(src):
            for f in files:
                if f.endswith(".rs"):
                    yield os.path.relpath(os.path.join(d, f), ROOT)
        for extra in ("build.rs",):
            p = os.path.join(ROOT, "crates", crate, extra)
            if os.path.exists(p):
                yield os.path.relpath(p, ROOT)


def cycles(crate):
    base = os.path.join(ROOT, "crates", crate, "src")
    if not os.path.isdir(base):
        return []
    files = {}
    for d, _, fs in os.walk(base):
        for f in fs:
            if f.endswith(".rs"):
                rel = os.path.relpath(os.path.join(d, f), base)
                # A module's tests in their own file (`#[cfg(test)] mod tests;`).
                if f == "tests.rs" and os.sep in rel:
                    continue
                top = rel.split(os.sep)[0]
                top = top[:-3] if top.endswith(".rs") else top
                if top not in ("lib", "main") and not rel.startswith("bin" + os.sep):
                    files.setdefault(top, []).append(os.path.join(d, f))
    mods = set(files)
    deps = {m: set() for m in mods}
    for m, fs in files.items():
        for f in fs:
            s = without_tests(f)
            names = re.findall(r"\bcrate::(\w+)", s)
            for group in re.findall(r"\bcrate::\{([^}]*)\}", s):
                names += re.findall(r"\b(\w+)\b", group)
            deps[m] |= {n for n in names if n in mods and n != m}
    found, state = [], {}

    def visit(m, stack):
        state[m] = 1
        for n in sorted(deps[m]):
            if state.get(n) == 1:
                found.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n, stack + [n])
        state[m] = 2

    for m in sorted(mods):
        if m not in state:
            visit(m, [m])
    return found


def kind_places():
    """Problems with where link kinds live: a file outside tests that names
    every `Transport` variant (an exhaustive match: where a new kind must
    go) outside the places ARCHITECTURE.md lists, or more than MAX_PLACES
    places listed."""
    t = strip(open(os.path.join(ROOT, "crates/vnet-control/src/transport.rs"), encoding="utf-8").read())
    m = re.search(r"pub enum Transport \{(.*?)\n\}", t, re.S)
    variants = re.findall(r"^ {4}(\w+)\b", m.group(1), re.M) if m else []
    doc = open(os.path.join(ROOT, "docs/ARCHITECTURE.md"), encoding="utf-8").read()
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
    long = [f for f in fns if f[3] > MAX]
    big = [f for f in files if f[0] > MAX_FILE]
    cyc = [(c, cy) for c in sorted(os.listdir(os.path.join(ROOT, "crates"))) for cy in cycles(c)]
    for c, cy in cyc:
        print(f"import cycle in {c}: " + " -> ".join(cy))
    for n, p, first, length in long:
        print(f"{p}:{first}: fn {n} is {length} lines, more than {MAX}")
    for n, p in big:
        print(f"{p}: {n} lines outside tests, more than {MAX_FILE}")
    kinds, places = kind_places()
    print(f"a link kind's places ({len(places)}): " + ", ".join(places))
    for k in kinds:
        print(k)
    sys.exit(1 if long or cyc or big or kinds else 0)


main()
