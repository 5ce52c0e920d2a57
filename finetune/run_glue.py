"""`python -m widenet_ds.train glue` as a script path, the way DeepSpeed's and NVIDIA's BERT recipes are started:

    deepspeed finetune/run_glue.py --task sst2 --data glue/SST-2 --init-from runs/e8 --deepspeed_config ...

No logic of its own: every option, check and message is the module entry's (`--help` lists them)."""

from widenet_ds.train import run_script

if __name__ == "__main__":
    run_script("glue")
