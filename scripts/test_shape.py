#!/usr/bin/env python3
"""scripts/shape.py's own tests: each probe is a small crate written to a
temporary tree, with the cycle shape.py must find (or must not).

Usage: python3 scripts/test_shape.py   (scripts/test.sh runs it before shape.py)"""
import importlib.util, os, tempfile, textwrap, unittest

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


if __name__ == "__main__":
    unittest.main()
