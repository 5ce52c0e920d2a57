"""Pretraining data: sources -> tokenizer -> ALBERT MLM+SOP examples -> shards -> distributed loader.

See docs/data.md. Entry points: `widenet-ds prepare-data` (prepare.py), `widenet-ds train-tokenizer`
(tokenizer.py), `PretrainingDataLoader` (loader.py), `load_tokenizer` (tokenizer.py).
"""
