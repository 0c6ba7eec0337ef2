"""Compiler passes, one per file: each a pure function from IR to IR (see DESIGN.md §2).

The lead composes them in one PIPELINE list here.
"""
