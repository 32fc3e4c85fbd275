"""Reports of plans and runs: the JSON documents, the terminal's lines, JUnit XML, Markdown."""
