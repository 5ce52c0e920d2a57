"""The files `widenet-ds convert to-hf` copies into every HF folder: the model's transformers code, self-contained
(torch + transformers only), read as files, never imported by widenet-ds itself."""
