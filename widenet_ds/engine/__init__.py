"""The DeepSpeed engine: its JSON checked before anything is built, the one `deepspeed.initialize`, LAMB, DeepSpeed's
JIT-built ops, torch.compile, and the third-party output a user cannot act on."""
