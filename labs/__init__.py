"""The workshop's labs: exercises with TODOs, their checks (python -m labs.check LAB) and solutions; README.md."""
