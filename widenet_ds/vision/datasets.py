"""Image classification datasets in their real on-disk formats, read without network access.

* Fashion-MNIST (the offline default): IDX files, gzipped or not -- Debian's `dataset-fashion-mnist`
  (/usr/share/datasets/fashion-mnist), torchvision's `FashionMNIST/raw` folder, or any folder with the
  four files;
* sklearn's bundled 8x8 digits (fast tests);
* CIFAR-10/100: torchvision's `cifar-10-batches-py` / `cifar-100-python` folders or their .tar.gz archives.
  Those are pickles; they are read with a restricted unpickler that builds only dicts, lists, strings,
  bytes, numbers and numeric numpy arrays and refuses anything else (no code can run);
* ImageNet-style ImageFolder (`<root>/train/<class>/*.JPEG`, `<root>/val/<class>/...`, read by Pillow);
* Hugging Face `datasets`: a `save_to_disk` folder or a folder of parquet files per split (e.g.
  `uoft-cs/cifar10`'s `plain_text/train-*.parquet`), with an image column and a label column.

Every reader returns `ImageSource`s (one per split): `load(i)` gives an HxWxC uint8 array. Problems
raise `DataError` naming the file and the fix, before training starts where they can be found then.
"""

from __future__ import annotations

import gzip
import io
import pickle
import struct
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from widenet_ds.errors import DataError

DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_FIX = ("install Debian's dataset-fashion-mnist (`apt-get install dataset-fashion-mnist`, which "
                     "`./launcher.sh test` and `vision-demo` do as root) or pass --data with the four IDX files "
                     "(train/t10k-images-idx3-ubyte[.gz], train/t10k-labels-idx1-ubyte[.gz])")
DATASETS = ("fashion-mnist", "digits", "cifar10", "cifar100", "imagenet-folder", "hf")
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png", ".bmp", ".webp")


@dataclass
class ImageSource:
    """One split: its size, labels, and a loader of image i as an HxWxC uint8 array."""

    name: str                              # for messages: "fashion-mnist train (/usr/share/...)"
    labels: np.ndarray                     # int64 [N]
    num_classes: int
    channels: int | None                   # None: decoded files, converted to the model's channels
    load: Callable[[int, int], np.ndarray] = field(repr=False)  # (index, channels) -> [H, W, C] uint8
    class_names: list[str] | None = None

    def __len__(self) -> int:
        return len(self.labels)


def _array_source(name: str, images: np.ndarray, labels: np.ndarray, num_classes: int,
                  class_names: list[str] | None = None) -> ImageSource:
    if images.ndim == 3:
        images = images[..., None]
    if images.dtype != np.uint8 or images.ndim != 4:
        raise DataError(f"{name}: images must be uint8 [N, H, W(, C)], got {images.dtype} {images.shape}.")
    if len(images) != len(labels):
        raise DataError(f"{name}: {len(images)} images but {len(labels)} labels; the files do not belong together.")
    return ImageSource(name, labels.astype(np.int64), num_classes, images.shape[3],
                       lambda i, _channels: images[i], class_names)


def check_labels(source: ImageSource) -> None:
    labels = source.labels
    if len(labels) == 0:
        raise DataError(f"{source.name} holds no examples; point --data at the full dataset.")
    if labels.min() < 0 or labels.max() >= source.num_classes:
        raise DataError(f"{source.name}: labels range over {labels.min()}..{labels.max()}, outside 0..{source.num_classes - 1}"
                        f" ({source.num_classes} classes); the label file is corrupt or from another dataset.")


# --- IDX (MNIST / Fashion-MNIST) ---------------------------------------------------------------------
def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzipped or raw): magic 0x0000 08 <ndim>, big-endian int32 dims, uint8 data."""
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except FileNotFoundError:
        raise DataError(f"{path} does not exist.") from None
    except (OSError, EOFError, zlib.error) as err:
        raise DataError(f"{path} is not a readable gzip file ({err}); the download is truncated or corrupt: "
                        f"fetch it again.") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError(f"{path} is not an IDX file of unsigned bytes (magic {raw[:4].hex()}, expected 000008xx).")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path} is truncated inside its IDX header; fetch it again.")
    dims = struct.unpack(f">{ndim}i", raw[4:header])
    expected = int(np.prod(dims))
    if len(raw) - header != expected:
        raise DataError(f"{path}: the header says {dims} = {expected} bytes of data, the file holds "
                        f"{len(raw) - header}; the file is truncated or corrupt: fetch it again.")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def _find_idx(root: Path, stem: str) -> Path | None:
    for folder in (root, root / "FashionMNIST" / "raw", root / "raw"):
        for name in (stem + ".gz", stem):
            if (folder / name).is_file():
                return folder / name
    return None


FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                         "Bag", "Ankle boot"]
DIGITS_CLASSES = [str(digit) for digit in range(10)]
# The datasets whose classes are fixed, with the name of each class index (the labels of exported models); the
# others read theirs from the data: CIFAR's meta file, ImageFolder's folders, the HF dataset's ClassLabel.
CLASS_NAMES = {"fashion-mnist": FASHION_MNIST_CLASSES, "digits": DIGITS_CLASSES}


def dataset_class_names(name: object) -> list[str] | None:
    """The class names of `--dataset name` when the dataset fixes them (`CLASS_NAMES`), else None."""
    return list(CLASS_NAMES[name]) if isinstance(name, str) and name in CLASS_NAMES else None


def fashion_mnist(root: Path | None = None) -> dict[str, ImageSource]:
    root = Path(root) if root is not None else DEBIAN_FASHION_MNIST
    if not root.is_dir():
        raise DataError(f"Fashion-MNIST folder {root} does not exist; {FASHION_MNIST_FIX}.")
    splits = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        paths = [_find_idx(root, f"{prefix}-{kind}-ubyte") for kind in ("images-idx3", "labels-idx1")]
        missing = [f"{prefix}-{kind}-ubyte[.gz]" for kind, p in zip(("images-idx3", "labels-idx1"), paths) if p is None]
        if missing:
            raise DataError(f"Fashion-MNIST in {root} lacks {', '.join(missing)}; {FASHION_MNIST_FIX}.")
        images, labels = read_idx(paths[0]), read_idx(paths[1])
        if images.ndim != 3 or labels.ndim != 1:
            raise DataError(f"{paths[0]} / {paths[1]}: expected images [N, H, W] and labels [N], got {images.shape} "
                            f"and {labels.shape}; the files are swapped or of another dataset.")
        splits[split] = _array_source(f"fashion-mnist {split} ({paths[0].parent})", images, labels, 10,
                                      FASHION_MNIST_CLASSES)
    return splits


# --- sklearn digits ----------------------------------------------------------------------------------
def digits(test_fraction: float = 0.2, seed: int = 0) -> dict[str, ImageSource]:
    """sklearn's 1,797 8x8 digits (values 0..16, scaled to 0..255), split by a fixed permutation."""
    from sklearn.datasets import load_digits  # heavy optional package, tests and demos only

    data = load_digits()
    images = np.clip(data.images * 16, 0, 255).astype(np.uint8)
    order = np.random.default_rng(seed).permutation(len(images))
    cut = int(len(images) * (1 - test_fraction))
    return {split: _array_source(f"sklearn digits {split}", images[idx], data.target[idx], 10, DIGITS_CLASSES)
            for split, idx in (("train", order[:cut]), ("test", order[cut:]))}


# --- CIFAR (python pickle batches) -------------------------------------------------------------------
class _RestrictedUnpickler(pickle.Unpickler):
    """Builds dicts/lists/str/bytes/numbers and numpy arrays only; any other global is refused."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR batch")
        return super().find_class(module, name)


def _unpickle_batch(raw: bytes, where: str) -> dict[str, Any]:
    try:
        batch = _RestrictedUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except pickle.UnpicklingError as err:
        raise DataError(f"{where} is not a CIFAR python batch ({err}); refusing to read it. Use the "
                        f"`cifar-10-python.tar.gz` / `cifar-100-python.tar.gz` archives from the CIFAR site or "
                        f"torchvision.") from None
    except (EOFError, ValueError, TypeError, struct.error, IndexError) as err:
        raise DataError(f"{where} is truncated or corrupt ({type(err).__name__}: {err}); fetch it again.") from None
    if not isinstance(batch, dict):
        raise DataError(f"{where} holds a {type(batch).__name__}, not a CIFAR batch dict.")
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in batch.items()}


CIFAR_LAYOUT = {
    10: ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], "labels",
         "batches.meta", "label_names"),
    100: ("cifar-100-python", ["train"], ["test"], "fine_labels", "meta", "fine_label_names"),
}


def cifar_archive(num_classes: int) -> str:
    return "cifar-10-python.tar.gz" if num_classes == 10 else "cifar-100-python.tar.gz"


def cifar_fix(num_classes: int) -> str:
    """What --data must hold for CIFAR-N, and that it is not bundled."""
    folder_name, train_files, test_files = CIFAR_LAYOUT[num_classes][:3]
    return (f"put torchvision's {folder_name}/ folder (its {', '.join(train_files + test_files)}) or "
            f"{cifar_archive(num_classes)} under --data; CIFAR-{num_classes} is not bundled (no Debian or PyPI "
            f"package ships it)")


def data_fix(name: str) -> str:
    """What the --data folder of dataset `name` must hold (a missing one's fix)."""
    if name in ("cifar10", "cifar100"):
        return cifar_fix(10 if name == "cifar10" else 100)
    if name == "imagenet-folder":
        return "pass a folder of train/<class>/<image files> (and val/ for evaluation), ImageNet's extracted layout"
    return "pass the folder holding the --dataset's files"


def cifar(root: Path, num_classes: int) -> dict[str, ImageSource]:
    """torchvision's layout: `<root>/cifar-10-batches-py/` (or the folder itself, or the .tar.gz archive)."""
    folder_name, train_files, test_files, label_key, meta_file, names_key = CIFAR_LAYOUT[num_classes]
    root = Path(root)
    archive_name = cifar_archive(num_classes)
    fix = cifar_fix(num_classes)
    files: dict[str, bytes] = {}
    archive = root if root.is_file() else root / archive_name
    folder = root if (root / train_files[0]).is_file() else root / folder_name
    if folder.is_dir():
        for name in train_files + test_files + [meta_file]:
            if (folder / name).is_file():
                files[name] = (folder / name).read_bytes()
        where = str(folder)
    elif archive.is_file():
        try:
            with tarfile.open(archive, "r:gz") as tar:
                for member in tar.getmembers():
                    base = Path(member.name).name
                    if member.isfile() and base in train_files + test_files + [meta_file]:
                        files[base] = tar.extractfile(member).read()
        except (tarfile.TarError, OSError, EOFError, zlib.error) as err:
            raise DataError(f"{archive} is not a readable .tar.gz archive ({err}); the download is truncated or "
                            f"corrupt: fetch it again.") from None
        where = str(archive)
    else:
        raise DataError(f"no CIFAR-{num_classes} at {root}; {fix}.")
    missing = [name for name in train_files + test_files if name not in files]
    if missing:
        raise DataError(f"CIFAR-{num_classes} at {where} lacks {', '.join(missing)}; {fix}.")
    class_names = None
    if meta_file in files:
        names = _unpickle_batch(files[meta_file], f"{where}/{meta_file}").get(names_key)
        class_names = [n.decode() if isinstance(n, bytes) else str(n) for n in names] if names else None
    splits = {}
    for split, names in (("train", train_files), ("test", test_files)):
        images, labels = [], []
        for name in names:
            batch = _unpickle_batch(files[name], f"{where}/{name}")
            data, batch_labels = batch.get("data"), batch.get(label_key)
            if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
                raise DataError(f"{where}/{name}: 'data' must be uint8 [N, 3072] (32x32x3), got "
                                f"{getattr(data, 'dtype', type(data).__name__)} {getattr(data, 'shape', '')}.")
            if batch_labels is None:
                raise DataError(f"{where}/{name} has no '{label_key}'; is it a CIFAR-{num_classes} batch?")
            images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
            labels.append(np.asarray(batch_labels, dtype=np.int64))
        splits[split] = _array_source(f"cifar{num_classes} {split} ({where})", np.concatenate(images),
                                      np.concatenate(labels), num_classes, class_names)
    return splits


# --- decoded image files (Pillow) --------------------------------------------------------------------
def _decode(path_or_bytes, channels: int, where: str) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError  # Pillow: only the file-based datasets need it

    try:
        with Image.open(path_or_bytes if isinstance(path_or_bytes, (str, Path)) else io.BytesIO(path_or_bytes)) as im:
            image = np.asarray(im.convert("L" if channels == 1 else "RGB"))
    except (UnidentifiedImageError, OSError, SyntaxError) as err:
        raise DataError(f"{where} is not a readable image ({err}); remove or replace the file.") from None
    return image[..., None] if image.ndim == 2 else image


def image_folder(root: Path) -> dict[str, ImageSource]:
    """ImageNet-style `<root>/{train,val}/<class>/<image>`; classes are the train folder's sorted names."""
    root = Path(root)
    train_dir = root / "train"
    if not train_dir.is_dir():
        raise DataError(f"no ImageFolder at {root}: expected {train_dir}/<class>/<image files> (and val/ for "
                        f"evaluation), the layout of ImageNet's extracted ILSVRC2012 train/val archives.")
    classes = sorted(p.name for p in train_dir.iterdir() if p.is_dir())
    if not classes:
        raise DataError(f"{train_dir} holds no class folders; expected {train_dir}/<class>/<image files>.")
    index = {name: i for i, name in enumerate(classes)}
    splits = {}
    for split in ("train", "val"):
        split_dir = root / split
        if not split_dir.is_dir():
            continue
        paths, labels = [], []
        for class_dir in sorted(p for p in split_dir.iterdir() if p.is_dir()):
            if class_dir.name not in index:
                raise DataError(f"{class_dir}: class {class_dir.name!r} is not one of the {len(classes)} classes of "
                                f"{train_dir}; val/ must use the train/ class folder names.")
            files = sorted(p for p in class_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            if not files and split == "train":
                raise DataError(f"{class_dir} holds no images ({', '.join(IMAGE_SUFFIXES)}); remove the empty class "
                                f"folder or add its images.")
            paths += files
            labels += [index[class_dir.name]] * len(files)
        splits["test" if split == "val" else split] = ImageSource(
            f"image folder {split} ({split_dir})", np.asarray(labels, dtype=np.int64), len(classes), None,
            lambda i, channels, paths=paths: _decode(paths[i], channels, str(paths[i])), classes)
    return splits


# --- Hugging Face datasets ---------------------------------------------------------------------------
IMAGE_COLUMNS = ("image", "img")
LABEL_COLUMNS = ("label", "fine_label", "labels")


def hf_dataset(root: Path) -> dict[str, ImageSource]:
    """A `Dataset(Dict).save_to_disk` folder, or parquet files named by split (train-*.parquet, test-*...)."""
    import datasets  # heavy optional package, only this reader needs it

    root = Path(root)
    if not root.is_dir():
        raise DataError(f"Hugging Face dataset folder {root} does not exist; pass the folder written by "
                        f"`save_to_disk`, or one holding <split>-*.parquet files.")
    parquet = {split: sorted(str(p) for p in root.rglob(f"{split}-*.parquet")) for split in ("train", "test", "validation")}
    try:
        if (root / "dataset_dict.json").is_file() or (root / "state.json").is_file():
            loaded = datasets.load_from_disk(str(root))
            loaded = loaded if isinstance(loaded, datasets.DatasetDict) else datasets.DatasetDict(train=loaded)
        elif any(parquet.values()):
            loaded = datasets.load_dataset("parquet", data_files={s: f for s, f in parquet.items() if f})
        else:
            raise DataError(f"{root} is neither a `save_to_disk` folder (dataset_dict.json / state.json) nor holds "
                            f"<split>-*.parquet files; save the dataset with `save_to_disk` or download its parquet "
                            f"files.")
    except DataError:
        raise
    except Exception as err:  # datasets / pyarrow raise many types for a broken folder
        raise DataError(f"{root}: the Hugging Face dataset cannot be read ({type(err).__name__}: {err}); "
                        f"fetch it again.") from None
    splits = {}
    for split_name, ds in loaded.items():
        image_col = next((c for c in IMAGE_COLUMNS if c in ds.column_names), None)
        label_col = next((c for c in LABEL_COLUMNS if c in ds.column_names), None)
        if image_col is None or label_col is None:
            raise DataError(f"{root} split {split_name!r} has columns {ds.column_names}; expected an image column "
                            f"({' or '.join(IMAGE_COLUMNS)}) and a label column ({' or '.join(LABEL_COLUMNS)}).")
        feature = ds.features[label_col]
        labels = np.asarray(ds[label_col], dtype=np.int64)
        names = getattr(feature, "names", None)
        num_classes = len(names) if names else int(labels.max()) + 1
        images = ds.cast_column(image_col, datasets.Image(decode=False))[image_col] \
            if isinstance(ds.features[image_col], datasets.Image) else None
        if images is None:
            raise DataError(f"{root} split {split_name!r}: column {image_col!r} is {ds.features[image_col]}, not an "
                            f"Image feature.")

        def load(i: int, channels: int, images=images, where=f"{root} split {split_name} row"):
            entry = images[i]
            data = entry.get("bytes") or Path(entry["path"]).read_bytes()
            return _decode(data, channels, f"{where} {i}")

        key = "test" if split_name in ("test", "validation") and "test" not in splits else split_name
        splits[key] = ImageSource(f"hf dataset {split_name} ({root})", labels, num_classes, None, load, names)
    return splits


def load_dataset(name: str, data_dir: Path | None) -> dict[str, ImageSource]:
    """{'train': ..., 'test': ...} of a named dataset; each split's labels checked."""
    if name == "fashion-mnist":
        splits = fashion_mnist(data_dir)
    elif name == "digits":
        splits = digits()
    elif name in ("cifar10", "cifar100") or name in ("imagenet-folder", "hf"):
        if data_dir is None:
            raise DataError(f"--dataset {name} needs --data (the dataset's folder; it is not bundled).")
        if name in ("cifar10", "cifar100"):
            splits = cifar(data_dir, 10 if name == "cifar10" else 100)
        elif name == "imagenet-folder":
            splits = image_folder(data_dir)
        else:
            splits = hf_dataset(data_dir)
    else:
        raise DataError(f"unknown dataset {name!r}; pick one of {', '.join(DATASETS)}.")
    if "train" not in splits:
        raise DataError(f"{name} at {data_dir} has no train split.")
    for source in splits.values():
        check_labels(source)
    return splits
