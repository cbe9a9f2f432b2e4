"""The folders of src/ and what each may include (docs/layout.md): every `#include "folder/..."`
of a file under src/FOLDER must name a folder below it, so that includes point down and no folder
needs one above it. MPI is known only to src/parallel/, and the only dynamic_casts are the
backends' downcasts of their own graph type. Usage: python3 tests/scripts/test_layout.py"""

import os
import re
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(REPO, "src")

# Each folder and the folders it may include (its own always).
MAY_INCLUDE = {
    "core": set(),
    "cuda": {"core"},
    "checkpoint": {"core"},
    "kernels": {"cuda", "core"},
    "parallel": {"kernels", "cuda", "core"},
    "model": {"checkpoint", "parallel", "kernels", "core"},
    "tools": {"model", "checkpoint", "parallel", "kernels", "core"},
    "engine": {"tools", "model", "checkpoint", "parallel", "kernels", "cuda", "core"},
    "serve": {"engine", "tools", "model", "checkpoint", "parallel", "kernels", "cuda", "core"},
    "capi": {"serve", "engine", "tools", "model", "checkpoint", "parallel", "kernels", "cuda", "core"},
    "cli": {"serve", "engine", "tools", "model", "checkpoint", "parallel", "kernels", "cuda", "core"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"/]+)/[^"]*"', re.M)


def sources():
    for root, _, names in os.walk(SRC):
        for name in sorted(names):
            if name.endswith((".h", ".cpp", ".cu", ".cuh")):
                path = os.path.join(root, name)
                with open(path) as f:
                    yield os.path.relpath(path, SRC), f.read()


def violations(files, rules):
    """(file, included folder) for every include that does not point down."""
    found = []
    for rel, text in files:
        folder = rel.split(os.sep)[0]
        for included in INCLUDE.findall(text):
            if included != folder and included in rules and included not in rules.get(folder, set()):
                found.append((rel, included))
    return found


class Layout(unittest.TestCase):
    def test_every_folder_is_in_the_plan(self):
        folders = {d for d in os.listdir(SRC) if os.path.isdir(os.path.join(SRC, d))}
        self.assertEqual(folders, set(MAY_INCLUDE), "a new folder of src/ needs its row in docs/layout.md and here")

    def test_includes_point_down(self):
        self.assertEqual(violations(sources(), MAY_INCLUDE), [])

    def test_only_parallel_knows_mpi(self):
        named = [rel for rel, text in sources()
                 if not rel.startswith("parallel" + os.sep) and re.search(r"TPDRAFT_HAVE_MPI|<mpi\.h>|\bMPI_", text)]
        self.assertEqual(named, [])

    def test_the_only_dynamic_casts_are_graph_downcasts(self):
        casts = [(rel, m.group(1)) for rel, text in sources()
                 for m in re.finditer(r"dynamic_cast<\s*(?:const\s+)?([\w:]+)", text)]
        self.assertTrue(casts, "the backends' graph downcasts")
        self.assertEqual([c for c in casts if not c[1].endswith("Graph")], [])

    def test_an_include_that_points_up_is_found(self):
        self.assertEqual(violations([("model/drafter.cpp", '#include "engine/engine.h"\n'),
                                     ("model/drafter.h", '#include "kernels/ops.h"\n#include <vector>\n')],
                                    MAY_INCLUDE), [("model/drafter.cpp", "engine")])


if __name__ == "__main__":
    unittest.main(verbosity=2)
