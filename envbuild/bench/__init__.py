"""`envbuild bench`: measure images on this host, side by side, and explain the figures.

- `run`: run the bench payload in each image, and the bench document it makes.
- `figures`: the figures of a document, each with its JSON pointer, and comparisons.
- `advice`: advice derived from a document, each line citing its figures.
- `terminal`: the terminal's view of a document; `html/`: the HTML report with plots.
- `session`: one `envbuild bench` run: measure, advise, compare, record and write.
"""
