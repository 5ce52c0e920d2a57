"""What the tests share: starting real runs (`launching`), their inputs (`launch_inputs`, `pretrain_support`,
`tasks_fixtures`, `run_folders`), the golden curves (`golden_curves`), the clusters the integration tests bring
up (`slurm_cluster`, `netns_cluster`, `netns_slurm`), reading the report's page (`report_page`,
`headless_browser`) and counting file opens (`open_counts`). Imported as `tests.support.<module>`: pytest
(`--import-mode=importlib`) imports tests/conftest.py as `tests.conftest`, and with it the `tests` package; the
processes the tests start get the checkout on PYTHONPATH (`launching.child_env`). docs/testing.md."""
