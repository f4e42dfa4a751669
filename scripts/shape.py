#!/usr/bin/env python3
"""The tree's shape, checked (issue 28): no function outside tests longer
than MAX lines, and no import cycle between vnetd's modules.

Usage: scripts/shape.py [--top N]   (exit 1 on a violation)

Functions are found by their `fn` line and the matching close brace (string
and char literals and comments skipped); `#[cfg(test)]` modules and
`tests/`, `benches/` and `fuzz/` are not counted. A module's imports are
its `crate::NAME` paths (NAME a top-level module of vnetd)."""
import os, re, sys

MAX = 120
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


def functions(path):
    s = strip(open(path, encoding="utf-8").read())
    # Blank #[cfg(test)] modules.
    for m in list(re.finditer(r"#\[cfg\(test\)\]\s*(pub\s+)?mod\s+\w+\s*\{", s)):
        e = block_end(s, m.end() - 1)
        s = s[:m.start()] + re.sub(r"[^\n]", " ", s[m.start():e + 1]) + s[e + 1:]
    for m in re.finditer(r"\bfn\s+(\w+)[^;{]*\{", s):
        # A signature holds no `{` but a where clause's; skip fn pointers in types.
        e = block_end(s, m.end() - 1)
        first = s.count("\n", 0, m.start()) + 1
        last = s.count("\n", 0, e) + 1
        yield m.group(1), first, last - first + 1


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


def cycles():
    base = os.path.join(ROOT, "crates", "vnetd", "src")
    mods = {os.path.splitext(f)[0] for f in os.listdir(base) if f.endswith(".rs")} | \
        {d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d))}
    mods -= {"lib", "main"}
    deps = {m: set() for m in mods}
    for m in mods:
        files = []
        if os.path.isdir(os.path.join(base, m)):
            for d, _, fs in os.walk(os.path.join(base, m)):
                files += [os.path.join(d, f) for f in fs if f.endswith(".rs")]
        else:
            files = [os.path.join(base, m + ".rs")]
        for f in files:
            for n in re.findall(r"\bcrate::(\w+)", strip(open(f, encoding="utf-8").read())):
                if n in mods and n != m:
                    deps[m].add(n)
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


def main():
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 10
    fns = [(n, p, first, length) for p in sources() for n, first, length in functions(os.path.join(ROOT, p))]
    fns.sort(key=lambda f: -f[3])
    print(f"largest {top} functions outside tests:")
    for n, p, first, length in fns[:top]:
        print(f"  {length:4} lines  {p}:{first}  {n}")
    long = [f for f in fns if f[3] > MAX]
    cyc = cycles()
    for c in cyc:
        print("import cycle in vnetd: " + " -> ".join(c))
    for n, p, first, length in long:
        print(f"{p}:{first}: fn {n} is {length} lines, more than {MAX}")
    sys.exit(1 if long or cyc else 0)


main()
