"""The tests of widenet-ds (docs/testing.md: the lanes and how to run them). A package, so that the tests and
tests/scripts/ import what they share as `tests.support.<module>` and `tests.scripts.<module>`."""
