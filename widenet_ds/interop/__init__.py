"""Other programs' formats: HF ALBERT (`albert.py`) and HF ViT (`hf_vit.py`) for dense models, and any model as an
HF folder with its own transformers code (`hf_export.py`, `hf_template/`, `hf_model_card.py`)."""
