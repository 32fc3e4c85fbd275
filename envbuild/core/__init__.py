"""What every stage shares, and nothing stage-specific: the contract between stages and the
user's places.

- `models`, `results`: frozen, keyword-only dataclasses passed from stage to stage.
- `labels`: the `org.envbuild.*` keys images carry, and the build server's build argument.
- `errors`: the errors a user can cause or meet, each with its exit code; `redact` takes every
  registered secret out of text before it leaves envbuild.
- `names`: checks of the strings that name things outside envbuild (image references,
  repositories, index URLs); `versions`: release strings as versions, CUDA tags.
- `files`: the one reader of a small file a user names (regular only, non-blocking, bounded);
  `yamlfile`: the one reader of envbuild's YAML files; `atomic`: replacing a file in one step.
- `settings`: settings read from the environment, each checked the one way.
- `resources`: where templates/ and matrices/ live; `places`: the user's data, cache and log
  folders; `store`: the record of smoke results, builds and publications there.
- `interrupt`: a run's identity (its id, where it runs) and a clean end on Ctrl-C or SIGTERM.
"""
