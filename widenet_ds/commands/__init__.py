"""The fronts of `widenet-ds`'s commands that are not a concept's own (cli.py dispatches to every command): `launch`
(train on N ranks, `--config` of a saved run), `demo` and `vision-demo`, `params`, and the checkpoint commands
`convert`, `branches`, `verify`."""
