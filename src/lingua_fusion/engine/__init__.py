"""Being rebuilt into serving/ and stream/ (issue 9)."""
