"""The transformers side of tests/integration/test_hf_fresh_venv.py, run by a virtualenv's python that has torch,
transformers and safetensors (+ Pillow for image pipelines, accelerate for the Trainer) and neither widenet-ds
nor DeepSpeed. It only uses what a user of the HF ecosystem would: Auto classes, pipelines, the Trainer.

    python hf_fresh_venv_side.py JOB.json RESULT.json

JOB holds the cases the parent test prepared (folders exported by `widenet-ds convert to-hf`, inputs and our
model's outputs as safetensors); RESULT gets what this side measured, for the parent to judge.
"""

import importlib.util
import json
import sys

import torch
import transformers
from safetensors.torch import load_file


def load(auto: str, folder: str, **kwargs):
    model, info = getattr(transformers, auto).from_pretrained(folder, trust_remote_code=True,
                                                               output_loading_info=True, **kwargs)
    return model.eval(), {k: sorted(v) for k, v in info.items() if k != "error_msgs"}


def parity(case: dict) -> dict:
    """Max |theirs - ours| of each output on the inputs our model was run on."""
    model, info = load(case["auto"], case["folder"], **case.get("kwargs", {}))
    inputs = load_file(case["inputs"])
    expected = load_file(case["expected"])
    with torch.no_grad():
        out = model(**inputs)
    return {"loading": info, "max_diff": {name: (out[name].float() - want.float()).abs().max().item()
                                          for name, want in expected.items()}}


def fill_mask(case: dict) -> list[dict]:
    pipe = transformers.pipeline("fill-mask", model=case["folder"], trust_remote_code=True)
    return [{"token": r["token"], "score": r["score"], "token_str": r["token_str"]}
            for r in pipe(case["text"], top_k=case["top_k"])]


def image_classification(case: dict) -> list[list[dict]]:
    from PIL import Image

    pipe = transformers.pipeline("image-classification", model=case["folder"], trust_remote_code=True)
    images = [Image.open(path) for path in case["images"]]
    return [[{"label": r["label"], "score": r["score"]} for r in result]
            for result in pipe(images, top_k=case["top_k"])]


def text_classification(case: dict) -> dict:
    """pipeline("text-classification") on texts, one a call: each one's top class by its name, and its score."""
    pipe = transformers.pipeline("text-classification", model=case["folder"], trust_remote_code=True)
    results = [pipe(text)[0] for text in case["texts"]]
    print("text-classification:", results)
    return {"results": [{"label": r["label"], "score": r["score"]} for r in results],
            "id2label": pipe.model.config.id2label}


def sst2_accuracy(case: dict) -> dict:
    """The dev set scored as a user would: AutoTokenizer + AutoModelForSequenceClassification, argmax."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(case["folder"], trust_remote_code=True)
    model, _ = load("AutoModelForSequenceClassification", case["folder"])
    rows = [line.rstrip("\n").split("\t") for line in open(case["dev"], encoding="utf-8")][1:]
    sentences, labels = [r[0] for r in rows], [int(r[1]) for r in rows]
    correct = 0
    for start in range(0, len(rows), 64):
        batch = tokenizer(sentences[start:start + 64], truncation=True, max_length=case["max_length"],
                          padding=True, return_tensors="pt")
        with torch.no_grad():
            predictions = model(**batch).logits.argmax(dim=-1)
        correct += sum(int(p) == y for p, y in zip(predictions.tolist(), labels[start:start + 64]))
    return {"accuracy": correct / len(rows), "examples": len(rows), "id2label": model.config.id2label}


def trainer_steps(case: dict) -> dict:
    """Three Trainer steps of masked-LM finetuning on a fixed masked batch: the loss the Trainer optimises
    (masked LM + balance_loss_weight x aux_loss) before and after, in eval mode."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(case["folder"], trust_remote_code=True)
    model, _ = load("AutoModelForMaskedLM", case["folder"])
    encoded = tokenizer(case["texts"], truncation=True, max_length=32, padding="max_length", return_tensors="pt")
    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.3, seed=0)
    batch = collator([{k: v[i] for k, v in encoded.items()} for i in range(len(case["texts"]))])
    examples = [{k: v[i] for k, v in batch.items()} for i in range(len(case["texts"]))]

    def loss() -> tuple[float, float]:
        model.eval()
        with torch.no_grad():
            out = model(**{k: v for k, v in batch.items()})
        return out.loss.item(), out.aux_loss.item()

    before = loss()
    router = model.widenet.encoder.ffn[0].router.weight.detach().clone()
    args = transformers.TrainingArguments(output_dir=case["output"], max_steps=3, learning_rate=2e-3,
                                          per_device_train_batch_size=len(examples), logging_steps=1,
                                          save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0,
                                          seed=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=examples)
    trainer.train()
    after = loss()
    return {"before": before, "after": after,
            "train_losses": [r["loss"] for r in trainer.state.log_history if "loss" in r],
            "router_changed": not torch.equal(router, model.widenet.encoder.ffn[0].router.weight.detach())}


def main(job_path: str, result_path: str) -> None:
    job = json.load(open(job_path))
    result = {"isolated": {name: importlib.util.find_spec(name) is None for name in ("widenet_ds", "deepspeed")},
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
              "parity": {name: parity(case) for name, case in job["parity"].items()},
              "fill_mask": fill_mask(job["fill_mask"]),
              "image_classification": image_classification(job["image_classification"]),
              "text_classification": text_classification(job["text_classification"]),
              "sst2": sst2_accuracy(job["sst2"]),
              "trainer": trainer_steps(job["trainer"])}
    json.dump(result, open(result_path, "w"), indent=2)


if __name__ == "__main__":
    main(*sys.argv[1:])
