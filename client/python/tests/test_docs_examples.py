"""docs/pytorch.md, docs/cupy.md and docs/jax.md show their examples as
the files under docs/examples/ are (the GPU test runs the files), and the
files are valid Python."""

import os
import re
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
MARK = re.compile(r"<!-- example: (\S+) -->\n```python\n(.*?)```", re.S)


class DocsExamplesTest(unittest.TestCase):
    def examples(self, page):
        with open(os.path.join(ROOT, "docs", page)) as f:
            found = MARK.findall(f.read())
        self.assertTrue(found, f"docs/{page} marks no example")
        return found

    def test_each_page_shows_its_example_file_as_it_is(self):
        for page, files in (("pytorch.md", ["docs/examples/torch_scale.py"]),
                            ("cupy.md", ["docs/examples/cupy_saxpy.py"]),
                            ("jax.md", ["docs/examples/jax_scale.py"])):
            shown = self.examples(page)
            self.assertEqual([p for p, _ in shown], files)
            for path, code in shown:
                with open(os.path.join(ROOT, path)) as f:
                    text = f.read()
                self.assertEqual(code, text, f"docs/{page} shows {path} differently")
                compile(text, path, "exec")


if __name__ == "__main__":
    unittest.main()
