"""The HTML report of `envbuild bench --html`: one self-contained page with plots.

The page reads the bench document (the `--json` output) and nothing else. The document comes
partly from inside images (names, errors, figures), so it is read as hostile: every string is
escaped and bounded, every number is a finite figure or missing, every list is cut, and whatever
is missing is said in words instead of drawn as an empty plot. The same document always gives
the same bytes.

- `reading`: the document read as hostile input: bounded strings, figures (`figures.number`),
  cut lists, and `Image`, one image as the page and its plots see it.
- `plots`: the plots, drawn with matplotlib and inlined as SVG; the one module of envbuild that
  imports matplotlib, and only when a page is rendered.
- `page`: the HTML around them: tables, advice, comparison, the sections per image; its
  `render_html(doc)` is the entry.
"""
