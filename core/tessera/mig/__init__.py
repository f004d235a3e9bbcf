"""MIG geometry: the per-model profile catalog and the layout planner (pure logic, no I/O).

``catalog`` says what a profile name means on a given GPU model; ``planner`` decides whether a
layout fits, enumerates the layouts a model can hold, and plans minimal-disruption changes.
"""
