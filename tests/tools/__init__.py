"""Tests of the tools' own code (`tools/`), folder by folder as in `tools/`."""
