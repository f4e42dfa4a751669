#!/usr/bin/env python3
"""scripts/shape.py's own tests: each probe is a small crate written to a
temporary tree, with the cycle shape.py must find (or must not); and
docs/ARCHITECTURE.md's "Two walks" checked against the tree (each file
named exists, none stepped into twice in its walk).

Usage: python3 scripts/test_shape.py   (scripts/test.sh runs it before shape.py)"""
import importlib.util, os, re, tempfile, textwrap, unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("shape", os.path.join(HERE, "shape.py"))
shape = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shape)


class Probe(unittest.TestCase):
    def crate(self, files):
        """`files` ({path under src: text}) as the crate `probe`; its cycles."""
        root = tempfile.mkdtemp(prefix="shape-probe.")
        self.addCleanup(lambda: __import__("shutil").rmtree(root))
        for path, text in files.items():
            p = os.path.join(root, "crates", "probe", "src", path)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w", encoding="utf-8") as f:
                f.write(textwrap.dedent(text))
        old, shape.ROOT = shape.ROOT, root
        self.addCleanup(lambda: setattr(shape, "ROOT", old))
        return [(kind, cycle) for kind, cycle, _ in shape.cycles("probe")]

    def test_two_files_through_a_reexport(self):
        # b.rs names `crate::A`, which lib.rs re-exports from a.rs: the
        # edge is b.rs -> a.rs, and a.rs -> b.rs closes the cycle.
        found = self.crate({
            "lib.rs": "mod a;\nmod b;\npub use a::A;\n",
            "a.rs": "use crate::b::B;\npub struct A(B);\n",
            "b.rs": "pub struct B;\nimpl B { pub fn a(&self) -> crate::A { todo!() } }\n",
        })
        self.assertIn(("files", ["a.rs", "b.rs", "a.rs"]), found)
        self.assertIn(("modules", ["a", "b", "a"]), found)

    def test_positive_control_one_way(self):
        # The same files with b.rs no longer naming A: nothing found.
        found = self.crate({
            "lib.rs": "mod a;\nmod b;\npub use a::A;\n",
            "a.rs": "use crate::b::B;\npub struct A(B);\n",
            "b.rs": "pub struct B;\n",
        })
        self.assertEqual(found, [])

    def test_parent_and_child_through_super(self):
        found = self.crate({
            "lib.rs": "mod x;\n",
            "x/mod.rs": "mod y;\npub struct X;\nfn f() { y::g(); }\n",
            "x/y.rs": "use super::X;\npub fn g() -> Option<X> { None }\n",
        })
        self.assertIn(("files", ["x/mod.rs", "x/y.rs", "x/mod.rs"]), found)

    def test_glob_import_of_the_parent(self):
        found = self.crate({
            "lib.rs": "mod x;\n",
            "x/mod.rs": "mod y;\npub struct X;\nfn f() { y::g(); }\n",
            "x/y.rs": "use super::*;\npub fn g() -> Option<X> { None }\n",
        })
        self.assertIn(("files", ["x/mod.rs", "x/y.rs", "x/mod.rs"]), found)

    def test_super_through_a_sibling_reexport_is_no_cycle(self):
        # y.rs names `super::Z`, which x/mod.rs only re-exports from z.rs:
        # resolved, the edge is y.rs -> z.rs, and no file names y.rs back.
        found = self.crate({
            "lib.rs": "mod x;\n",
            "x/mod.rs": "mod y;\nmod z;\npub use z::Z;\nfn f() { y::g(); }\n",
            "x/y.rs": "pub fn g() -> Option<super::Z> { None }\n",
            "x/z.rs": "pub struct Z;\n",
        })
        self.assertEqual(found, [])

    def test_tests_do_not_count(self):
        found = self.crate({
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "pub struct A(crate::b::B);\n",
            "b.rs": "pub struct B;\n#[cfg(test)]\nmod tests {\n    use crate::a::A;\n}\n",
        })
        self.assertEqual(found, [])


# docs/ARCHITECTURE.md's "Two walks": each walk a run of numbered steps
# (`N. \`path\`: ...`, a new walk at each `1.`), each step one file first
# entered there; `- again \`path\`` a later entry into a file walked before.
STEP = re.compile(r"^(\d+)\. `([^`]+)`")
AGAIN = re.compile(r"^\s+- again `([^`]+)`")


def walks(text):
    """The walks of `text`'s "## Two walks" section: [[(kind, path, line)]]."""
    section = text.split("\n## Two walks\n", 1)[1].split("\n## ", 1)[0]
    out = []
    for n, line in enumerate(section.splitlines()):
        m = STEP.match(line)
        if m:
            if m.group(1) == "1":
                out.append([])
            out[-1].append(("step", m.group(2), n))
        elif AGAIN.match(line) and out:
            out[-1].append(("again", AGAIN.match(line).group(1), n))
    return out


def walk_errors(text, root):
    """What is wrong with the walks: a file that does not exist, a step
    naming a file its walk entered already, an "again" naming one it did not."""
    errors = []
    for w in walks(text):
        seen = set()
        for kind, path, n in w:
            if not os.path.isfile(os.path.join(root, path)):
                errors.append(f"{path}: no such file")
            if kind == "step" and path in seen:
                errors.append(f"{path}: a step again (an `again` line, or a walk that enters it once)")
            if kind == "again" and path not in seen:
                errors.append(f"{path}: `again` before any step entered it")
            seen.add(path)
    return errors


class Walks(unittest.TestCase):
    ROOT = os.path.dirname(HERE)

    def test_the_architectures_walks_name_files_that_exist_each_once(self):
        with open(os.path.join(self.ROOT, "docs", "ARCHITECTURE.md"), encoding="utf-8") as f:
            text = f.read()
        ws = walks(text)
        # A control request; a policy decision's first packet; a later one.
        self.assertEqual(len(ws), 3, ws)
        self.assertTrue(all(len([s for s in w if s[0] == "step"]) >= 4 for w in ws), ws)
        self.assertEqual(walk_errors(text, self.ROOT), [])

    def test_a_walk_that_drifted_is_caught(self):
        # The positive control: a file gone, a file stepped into twice, an
        # "again" with no first entry, each named.
        text = ("x\n## Two walks\n\n1. `scripts/shape.py`: a.\n2. `scripts/gone.py`: b.\n"
                "   - again `scripts/test.sh`: c.\n3. `scripts/shape.py`: d.\n\n## Next\n")
        self.assertEqual(walk_errors(text, self.ROOT), [
            "scripts/gone.py: no such file",
            "scripts/test.sh: `again` before any step entered it",
            "scripts/shape.py: a step again (an `again` line, or a walk that enters it once)",
        ])


if __name__ == "__main__":
    unittest.main()
