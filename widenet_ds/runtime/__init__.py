"""The runtime: launch environment, distributed set-up, DeepSpeed config validation, the engine (the one
`deepspeed.initialize`) and LAMB."""
