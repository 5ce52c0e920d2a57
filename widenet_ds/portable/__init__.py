"""The portable checkpoint folder a user keeps: its format (config.json + model.safetensors + tokenizer, every
architecture the folder can hold), fitting its weights into a model of any ep_size, and ParaFormer's branch
compression and expansion."""
