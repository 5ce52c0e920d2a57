"""The command fronts of `widenet-ds` over checkpoints: `convert`, `branches`, `verify` (cli.py dispatches to them)."""
