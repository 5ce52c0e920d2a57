"""`python -m widenet_ds.train pretrain` as a script path, the way DeepSpeed's and NVIDIA's BERT recipes are started:

    deepspeed pretrain/run_pretrain.py --model-config widenet-base-e4 --data data/phase1 --deepspeed_config ds_configs/...json ...

No logic of its own: every option, check and message is the module entry's (`--help` lists them)."""

from widenet_ds.train import run_script

if __name__ == "__main__":
    run_script("pretrain")
