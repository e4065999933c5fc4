"""Instance backends: one file per backend behind the Protocol in base.py."""
