"""The measurements every number in the documents comes from (README.md in this folder). Each module is a
script, `python benchmarks/NAME.py`; they share `record` (the run record, the machine, the commit) and `markdown`."""
