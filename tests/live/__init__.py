"""Tests against live public services (pypi.org); deselect with -m 'not live' when offline."""
