"""Vision data: every reader on a small fixture in its real on-disk format, the loader's order and exact resume,
augmentation, and bad inputs that each give one clear error."""

from __future__ import annotations

import gzip
import io
import pickle
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from widenet_ds.errors import ConfigError, DataError
from widenet_ds.tasks.classify.task import check_data_fits_model
from widenet_ds.vision.augment import BatchAugmenter
from widenet_ds.vision.augment_config import AugmentConfig
from widenet_ds.vision.config import VisionConfig
from widenet_ds.vision.datasets import (
    DEBIAN_FASHION_MNIST,
    cifar,
    dataset_class_names,
    digits,
    fashion_mnist,
    hf_dataset,
    image_folder,
    load_dataset,
    read_idx,
)
from widenet_ds.vision.loader import ImageLoader

RNG = np.random.default_rng(0)


# --- fixtures in the real formats --------------------------------------------------------------------
def write_idx(path: Path, array: np.ndarray, compress: bool = True) -> Path:
    raw = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}i", *array.shape) + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)
    return path


def make_fashion_mnist(root: Path, n_train: int = 40, n_test: int = 20, compress: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if compress else ""
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(root / f"{prefix}-images-idx3-ubyte{suffix}", RNG.integers(0, 256, (n, 28, 28)), compress)
        write_idx(root / f"{prefix}-labels-idx1-ubyte{suffix}", np.arange(n) % 10, compress)
    return root


def cifar_batch(n: int, label_key: str, classes: int) -> bytes:
    # As the CIFAR site's files: a dict with bytes keys, uint8 data [N, 3072], a list of int labels (protocol 2).
    return pickle.dumps({b"batch_label": b"fixture", label_key.encode(): [int(i % classes) for i in range(n)],
                         b"data": RNG.integers(0, 256, (n, 3072), dtype=np.uint8),
                         b"filenames": [f"img{i}.png".encode() for i in range(n)]}, protocol=2)


def make_cifar10(root: Path, archive: bool = False) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for i in range(1, 6):
        (folder / f"data_batch_{i}").write_bytes(cifar_batch(6, "labels", 10))
    (folder / "test_batch").write_bytes(cifar_batch(10, "labels", 10))
    (folder / "batches.meta").write_bytes(pickle.dumps({b"label_names": [f"c{i}".encode() for i in range(10)]}, protocol=2))
    if archive:
        with tarfile.open(root / "cifar-10-python.tar.gz", "w:gz") as tar:
            tar.add(folder, arcname="cifar-10-batches-py")
        import shutil
        shutil.rmtree(folder)
    return root


def make_image_folder(root: Path) -> Path:
    from PIL import Image

    for split, per_class in (("train", 3), ("val", 2)):
        for c, name in enumerate(("n01440764", "n01443537", "n01484850")):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                size = (40 + 7 * i, 30 + 5 * c)  # different sizes and aspect ratios, as ImageNet's
                image = Image.fromarray(RNG.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
                image.save(folder / f"{name}_{i}.{'JPEG' if i % 2 == 0 else 'png'}")
    return root


# --- readers -----------------------------------------------------------------------------------------
def test_fashion_mnist_idx_gzipped_and_raw(tmp_path):
    for compress in (True, False):
        root = make_fashion_mnist(tmp_path / f"fm{compress}", compress=compress)
        splits = fashion_mnist(root)
        assert len(splits["train"]) == 40 and len(splits["test"]) == 20
        assert splits["train"].load(3, 1).shape == (28, 28, 1) and splits["train"].labels[13] == 3


def test_fashion_mnist_torchvision_layout(tmp_path):
    make_fashion_mnist(tmp_path / "FashionMNIST" / "raw", compress=False)
    assert len(fashion_mnist(tmp_path)["test"]) == 20


@pytest.mark.skipif(not DEBIAN_FASHION_MNIST.is_dir(), reason="Debian's dataset-fashion-mnist is not installed "
                                                              "(./launcher.sh test installs it as root)")
def test_debian_fashion_mnist_is_the_real_dataset():
    splits = load_dataset("fashion-mnist", None)
    assert len(splits["train"]) == 60000 and len(splits["test"]) == 10000
    assert np.bincount(splits["test"].labels).tolist() == [1000] * 10


def test_digits_split_is_fixed_and_disjoint():
    a, b = digits(), digits()
    assert np.array_equal(a["train"].labels, b["train"].labels)
    assert len(a["train"]) + len(a["test"]) == 1797
    assert a["train"].load(0, 1).dtype == np.uint8 and a["train"].load(0, 1).max() > 100


def test_datasets_with_fixed_classes_name_them_and_their_sources_carry_the_names(tmp_path):
    assert dataset_class_names("digits") == [str(i) for i in range(10)] == digits()["test"].class_names
    names = dataset_class_names("fashion-mnist")
    assert len(names) == 10 and names[0] == "T-shirt/top" and names[9] == "Ankle boot"
    assert fashion_mnist(make_fashion_mnist(tmp_path))["train"].class_names == names
    # The others' names come with the data (CIFAR's meta file, folders, ClassLabels); unknown names have none.
    assert [dataset_class_names(name) for name in ("cifar10", "imagenet-folder", "hf", "mnist", None, 3)] == [None] * 6
    names.append("changed")  # a copy: the dataset's own list stays as it is
    assert len(dataset_class_names("fashion-mnist")) == 10


@pytest.mark.parametrize("archive", [False, True])
def test_cifar10_folder_and_archive(tmp_path, archive):
    splits = cifar(make_cifar10(tmp_path, archive=archive), 10)
    assert len(splits["train"]) == 30 and len(splits["test"]) == 10
    assert splits["train"].load(0, 3).shape == (32, 32, 3)
    assert splits["train"].class_names[:2] == ["c0", "c1"]


def test_cifar100_folder(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    (folder / "train").write_bytes(cifar_batch(8, "fine_labels", 100))
    (folder / "test").write_bytes(cifar_batch(4, "fine_labels", 100))
    splits = cifar(tmp_path, 100)
    assert splits["train"].num_classes == 100 and splits["test"].labels.tolist() == [0, 1, 2, 3]


def test_image_folder_decodes_and_resizes(tmp_path):
    splits = image_folder(make_image_folder(tmp_path))
    assert len(splits["train"]) == 9 and len(splits["test"]) == 6
    assert splits["train"].class_names == ["n01440764", "n01443537", "n01484850"]
    loader = ImageLoader(splits["train"], 16, 3, micro_batch_size=4, rank=0, world_size=1, seed=0, train=True)
    batch = next(iter(loader))
    assert batch["pixels"].shape == (4, 3, 16, 16) and batch["pixels"].dtype == torch.uint8


def test_hf_parquet_and_save_to_disk(tmp_path):
    import datasets
    from PIL import Image

    def image_bytes(i):
        buffer = io.BytesIO()
        Image.fromarray(np.full((32, 32, 3), i * 20, dtype=np.uint8)).save(buffer, format="PNG")
        return buffer.getvalue()

    features = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c"])})
    for split, n in (("train", 6), ("test", 3)):
        ds = datasets.Dataset.from_dict({"img": [{"bytes": image_bytes(i), "path": None} for i in range(n)],
                                         "label": [i % 3 for i in range(n)]}, features=features)
        (tmp_path / "parquet" / "plain_text").mkdir(parents=True, exist_ok=True)
        ds.to_parquet(str(tmp_path / "parquet" / "plain_text" / f"{split}-00000-of-00001.parquet"))
        ds.save_to_disk(str(tmp_path / "disk" / split))
    (tmp_path / "disk" / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    for root in (tmp_path / "parquet", tmp_path / "disk"):
        splits = hf_dataset(root)
        assert len(splits["train"]) == 6 and splits["train"].num_classes == 3
        assert splits["test"].load(2, 3)[0, 0].tolist() == [40, 40, 40]
        assert splits["train"].load(1, 1).shape == (32, 32, 1)  # converted to the model's channels


# --- loader ------------------------------------------------------------------------------------------
def test_loader_shards_ranks_and_resumes_exactly():
    source = digits()["train"]
    loaders = [ImageLoader(source, 8, 1, 16, rank, 2, seed=5, train=True) for rank in (0, 1)]
    per_epoch = loaders[0].batches_per_epoch()
    assert per_epoch == len(source) // 32
    streams = [iter(loader) for loader in loaders]
    first = [[next(s)["labels"] for _ in range(per_epoch + 3)] for s in streams]
    # within an epoch the two ranks see disjoint images; a resumed loader continues the same sequence
    state = loaders[0].state_dict()
    assert state["epoch"] == 1 and state["consumed"] == 3 * 32
    fresh = ImageLoader(source, 8, 1, 16, 0, 2, seed=5, train=True)
    fresh.load_state_dict(state)
    reference = iter(loaders[0])
    assert all(torch.equal(next(iter(fresh))["pixels"], next(reference)["pixels"]) for _ in range(1))
    assert not torch.equal(first[0][0], first[0][per_epoch])  # a new permutation each epoch


def test_another_micro_batch_continues_with_the_images_of_the_next_step():
    """Steps of 32: 2 ranks x 16 continued on 4 ranks x 8 -- the same images in the next step, other micro-batches."""
    source = digits()["train"]
    two = [ImageLoader(source, 8, 1, 16, rank, 2, seed=5, train=True) for rank in (0, 1)]
    streams = [iter(loader) for loader in two]
    for stream in streams:
        next(stream)
    four = [ImageLoader(source, 8, 1, 8, rank, 4, seed=5, train=True) for rank in range(4)]
    for loader in four:
        loader.load_state_dict(two[0].state_dict())
    expected = sorted(torch.cat([next(stream)["labels"] for stream in streams]).tolist())
    got = [next(iter(loader))["labels"] for loader in four]
    assert sorted(torch.cat(got).tolist()) == expected and len(got[0]) == 8


def test_a_loader_state_of_before_the_order_was_recorded_resumes_in_its_order():
    """{"epoch", "batch", "world", "seed"}, as that version wrote it (formats.py, loader_state.image version 1)."""
    source = digits()["train"]
    legacy = ImageLoader(source, 8, 1, 16, 0, 2, seed=5, train=True, order="legacy")
    stream = iter(legacy)
    for _ in range(3):
        next(stream)
    resumed = ImageLoader(source, 8, 1, 16, 0, 2, seed=5, train=True, order="legacy")
    resumed.load_state_dict({"epoch": 0, "batch": 3, "world": 2, "seed": 5})
    assert resumed.state_dict() == legacy.state_dict() and legacy.state_dict()["consumed"] == 3 * 16 * 2
    assert torch.equal(next(iter(resumed))["pixels"], next(stream)["pixels"])
    with pytest.raises(DataError, match="loader state of the legacy order cannot continue in the global-chunks order"):
        ImageLoader(source, 8, 1, 16, 0, 2, seed=5, train=True).load_state_dict({"epoch": 0, "batch": 3, "world": 2,
                                                                                 "seed": 5})


def test_eval_loader_pads_to_equal_batches_with_zero_weight():
    source = digits()["test"]  # 360 images
    batches = [list(ImageLoader(source, 8, 1, 50, rank, 2, seed=0, train=False)) for rank in (0, 1)]
    assert len(batches[0]) == len(batches[1]) == 4  # ceil(360 / 100)
    assert all(b["pixels"].shape[0] == 50 for rank in batches for b in rank)
    assert sum(float(b["weight"].sum()) for rank in batches for b in rank) == 360


def test_augmentation_authors_pipeline_and_mixup_targets():
    torch.manual_seed(0)
    augment = BatchAugmenter(AugmentConfig(randaugment_ops=2, randaugment_magnitude=15, inception_crop=True, flip=True,
                                           mixup_alpha=0.5, label_smoothing=0.1), 28, 10)
    pixels = torch.randint(0, 256, (8, 1, 28, 28), dtype=torch.uint8)
    x, targets = augment(pixels, torch.arange(8))
    assert x.shape == (8, 1, 28, 28) and x.min() >= -1 and x.max() <= 1
    assert targets.shape == (8, 10) and torch.allclose(targets.sum(1), torch.ones(8))
    assert (targets.max(1).values < 1).any()  # mixed
    cut = BatchAugmenter(AugmentConfig(cutmix_alpha=1.0), 28, 10)
    _, t = cut(pixels, torch.arange(8))
    assert torch.allclose(t.sum(1), torch.ones(8))


# --- bad inputs: one clear error each ---------------------------------------------------------------
def expect(error, match, fn, *args):
    with pytest.raises(error) as err:
        fn(*args)
    assert match in str(err.value), str(err.value)
    return str(err.value)


def test_bad_missing_fashion_mnist_names_the_debian_package(tmp_path):
    message = expect(DataError, "does not exist", fashion_mnist, tmp_path / "nowhere")
    assert "apt-get install dataset-fashion-mnist" in message
    make_fashion_mnist(tmp_path / "partial")
    (tmp_path / "partial" / "t10k-labels-idx1-ubyte.gz").unlink()
    assert "apt-get install" in expect(DataError, "lacks t10k-labels-idx1-ubyte", fashion_mnist, tmp_path / "partial")


def test_bad_corrupt_gzip_and_truncated_idx(tmp_path):
    root = make_fashion_mnist(tmp_path / "fm")
    good = (root / "train-images-idx3-ubyte.gz").read_bytes()
    (root / "train-images-idx3-ubyte.gz").write_bytes(good[: len(good) // 2])
    expect(DataError, "not a readable gzip file", fashion_mnist, root)
    write_idx(root / "train-images-idx3-ubyte.gz", RNG.integers(0, 256, (40, 28, 28)))
    raw = gzip.decompress((root / "train-images-idx3-ubyte.gz").read_bytes())
    (root / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(raw[:-100]))
    expect(DataError, "truncated or corrupt", fashion_mnist, root)
    (root / "x").write_bytes(b"PK\x03\x04 not idx")
    expect(DataError, "not an IDX file", read_idx, root / "x")


def test_bad_labels_out_of_range(tmp_path):
    root = make_fashion_mnist(tmp_path / "fm")
    write_idx(root / "train-labels-idx1-ubyte.gz", np.arange(40) % 12)
    expect(DataError, "outside 0..9", load_dataset, "fashion-mnist", root)


def test_bad_images_and_labels_of_different_counts(tmp_path):
    root = make_fashion_mnist(tmp_path / "fm")
    write_idx(root / "t10k-labels-idx1-ubyte.gz", np.arange(19) % 10)
    expect(DataError, "20 images but 19 labels", fashion_mnist, root)


def test_bad_corrupt_cifar_archive_and_missing_batch(tmp_path):
    make_cifar10(tmp_path / "a", archive=True)
    archive = tmp_path / "a" / "cifar-10-python.tar.gz"
    archive.write_bytes(archive.read_bytes()[:300])
    expect(DataError, "not a readable .tar.gz archive", cifar, tmp_path / "a", 10)
    make_cifar10(tmp_path / "b")
    (tmp_path / "b" / "cifar-10-batches-py" / "data_batch_3").unlink()
    expect(DataError, "lacks data_batch_3", cifar, tmp_path / "b", 10)
    expect(DataError, "no CIFAR-100", cifar, tmp_path / "b", 100)


def test_bad_cifar_pickle_with_code_is_refused(tmp_path):
    make_cifar10(tmp_path)

    class Evil:
        def __reduce__(self):
            return (print, ("this must never run",))

    (tmp_path / "cifar-10-batches-py" / "data_batch_1").write_bytes(pickle.dumps({b"data": Evil()}, protocol=2))
    expect(DataError, ".print is not allowed", cifar, tmp_path, 10)


def test_bad_image_folder_layouts(tmp_path):
    expect(DataError, "expected", image_folder, tmp_path)  # no train/
    (tmp_path / "train" / "cat").mkdir(parents=True)
    expect(DataError, "holds no images", image_folder, tmp_path)
    root = make_image_folder(tmp_path / "ok")
    (root / "val" / "n99999999").mkdir()
    expect(DataError, "val/ must use the train/ class folder names", image_folder, root)


def test_bad_unreadable_image_file_names_the_file(tmp_path):
    root = make_image_folder(tmp_path)
    broken = root / "train" / "n01440764" / "n01440764_0.JPEG"
    broken.write_bytes(b"not a jpeg")
    splits = image_folder(root)
    loader = ImageLoader(splits["train"], 16, 3, 9, 0, 1, seed=0, train=True)
    expect(DataError, "n01440764_0.JPEG is not a readable image", lambda: next(iter(loader)))


def test_bad_channel_and_class_mismatch_with_the_model(tmp_path):
    splits = cifar(make_cifar10(tmp_path), 10)
    model = VisionConfig.from_preset("widenet-vit-tiny")  # 1 channel
    expect(DataError, "--set num_channels=3", check_data_fits_model, splits, model, "cifar10")
    model = VisionConfig.from_preset("widenet-vit-tiny", num_channels=3, num_classes=5)
    expect(DataError, "--set num_classes=10", check_data_fits_model, splits, model, "cifar10")


def test_bad_image_size_not_divisible_by_patch():
    expect(ConfigError, "not divisible by patch_size = 16", lambda: VisionConfig.from_preset("vit-b16", image_size=225))


def test_bad_dataset_without_data_dir_and_too_small_for_a_batch(tmp_path):
    expect(DataError, "needs --data", load_dataset, "cifar10", None)
    source = fashion_mnist(make_fashion_mnist(tmp_path / "fm", n_train=10))["train"]
    expect(DataError, "fewer than one step", lambda: ImageLoader(source, 28, 1, 8, 0, 2, 0, train=True))


def test_bad_hf_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    expect(DataError, "neither a `save_to_disk` folder", hf_dataset, tmp_path / "empty")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "train-00000-of-00001.parquet").write_bytes(b"PAR1 garbage")
    expect(DataError, "cannot be read", hf_dataset, tmp_path / "broken")
