"""`python -m widenet_ds.train squad` as a script path, the way DeepSpeed's and NVIDIA's BERT recipes are started:

    deepspeed finetune/run_squad.py --version 1.1 --data squad/train-v1.1.json --init-from runs/e8 ...

No logic of its own: every option, check and message is the module entry's (`--help` lists them)."""

from widenet_ds.train import run_script

if __name__ == "__main__":
    run_script("squad")
