"""Programs the tests start as processes (under the `deepspeed` launcher or `python`), each run by its path;
some tests also import one for the inputs it builds (`tests.scripts.convert_make_checkpoint`)."""
