"""What the tests share: starting real runs (`launching`), their inputs (`launch_inputs`, `pretrain_support`,
`tasks_fixtures`), the golden curves (`golden_curves`), the clusters the integration tests bring up
(`slurm_cluster`, `netns_cluster`, `netns_slurm`), reading the report's page (`report_page`, `headless_browser`)
and counting file opens (`open_counts`). Imported as `tests.support.<module>`: the checkout's root is on
sys.path (pytest's rootdir, as `python -m pytest` and the test scripts' PYTHONPATH put it there)."""
