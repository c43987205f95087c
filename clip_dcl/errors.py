"""The error a bad command-line value raises, shared by training (``clip_dcl.train``) and evaluation
(``clip_dcl.eval``): each command catches it, prints its message after the command's name and exits 2."""

from __future__ import annotations


class FlagError(ValueError):
    """A flag value that cannot work; the message names the flag and the value."""
