"""`envbuild bench`: measure images on this host, side by side, and explain the figures.

- `session`: one `envbuild bench` run: measure each image, advise, compare, record, write.
- `run`: one image's bench, through the payload runner; which images are vetted to bench.
- `document`: the bench document, and one read back (`--compare FILE`), checked as hostile.
- `figures`: the figures of a document, each with its JSON pointer; the one number reader.
- `compare`: each figure beside the same figure of an earlier run; regressions.
- `advice`: advice derived from a document, each line citing its figures.
- `terminal`: the terminal's view of a document; `html/`: the HTML report with plots.
"""
