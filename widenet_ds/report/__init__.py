"""`widenet-ds report`: run folders (pretraining, image classification, finetuning) -> one HTML page with
PNG plots beside it.

`metrics` reads the folders as they are (live runs, partial or broken ones included; the files through
`widenet_ds.run_folder`), `branches` gathers ParaFormer's compression curves, `plots` draws the curves and
expert-load heatmaps with matplotlib, `page` writes the HTML, `cli` ties them together and writes the
output folder atomically.
"""
