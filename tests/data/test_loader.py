"""PretrainingDataLoader: rank slices, exact resume, masking, flat memory, damaged data folders."""

from __future__ import annotations

import collections
import shutil
import tracemalloc
from pathlib import Path

import pytest
import torch

from widenet_ds.data.batch_order import GLOBAL_CHUNKS, RANK_STRIDED
from widenet_ds.data.examples import ExampleConfig
from widenet_ds.data.loader import FeistelPermutation, PretrainingDataLoader
from widenet_ds.data.prepare import PrepareConfig, prepare
from widenet_ds.data.shards import Shard, token_dtype
from widenet_ds.data.sources import parse_source
from widenet_ds.data.tokenizer import load_tokenizer, save_tokenizer, train_tokenizer
from widenet_ds.errors import DataError

KEYS = ("input_ids", "token_type_ids", "attention_mask", "mlm_labels", "sop_labels")


def _prepare(folder: Path, text: Path, vocab: Path, seq_length: int = 64, **config) -> Path:
    prepare([parse_source(str(text))], folder, PrepareConfig(ExampleConfig(seq_length=seq_length), **config),
            str(vocab), progress=False)
    return folder


@pytest.fixture(scope="module")
def vocab(shared_data) -> Path:
    return shared_data / "vocab" / "bert-base-uncased-vocab.txt"


@pytest.fixture(scope="module")
def wiki(shared_data) -> Path:
    return shared_data / "corpus" / "wikitext-2" / "wiki.valid.tokens"


@pytest.fixture(scope="module")
def dynamic_data(tmp_path_factory, wiki, vocab) -> Path:
    return _prepare(tmp_path_factory.mktemp("dynamic"), wiki, vocab, partition_chars=300_000)


@pytest.fixture(scope="module")
def static_data(tmp_path_factory, wiki, vocab) -> Path:
    return _prepare(tmp_path_factory.mktemp("static"), wiki, vocab, masking="static", dupe_factor=1)


def original_tokens(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Undo the masking: labels hold the original token wherever one is predicted."""
    return torch.where(batch["mlm_labels"] != -100, batch["mlm_labels"], batch["input_ids"])


def all_examples(data: Path) -> collections.Counter:
    loader = PretrainingDataLoader(data, 1)
    dtype = token_dtype(loader.manifest.vocab_size)
    found = collections.Counter()
    for info in loader.manifest.splits["train"].shards:
        shard = Shard(data / info["name"], info, dtype)
        for i in range(shard.num_examples):
            found[tuple(int(t) for t in shard.example(i)[0])] += 1
    return found


def test_batches_follow_the_contract(dynamic_data):
    loader = PretrainingDataLoader(dynamic_data, micro_batch_size=4, seed=3)
    batch = next(iter(loader))
    assert set(batch) == set(KEYS)
    assert all(batch[k].dtype == torch.int64 for k in KEYS)
    assert batch["input_ids"].shape == (4, 64) and batch["sop_labels"].shape == (4,)
    real = batch["attention_mask"].bool()
    assert (batch["input_ids"][~real] == 0).all() and (batch["mlm_labels"][~real] == -100).all()
    assert (batch["mlm_labels"] != -100).sum(1).min() >= 1
    assert set(batch["sop_labels"].tolist()) <= {0, 1}
    cls, sep = 101, 102  # bert-base-uncased
    assert (original_tokens(batch)[:, 0] == cls).all()
    for row in range(4):
        length = int(real[row].sum())
        types = batch["token_type_ids"][row, :length]
        a_length = int((types == 0).sum())
        assert original_tokens(batch)[row, a_length - 1] == sep and original_tokens(batch)[row, length - 1] == sep
        assert (types[a_length:] == 1).all() and (batch["token_type_ids"][row, length:] == 0).all()


def test_two_ranks_read_disjoint_slices_that_cover_the_epoch(dynamic_data):
    ranks = [PretrainingDataLoader(dynamic_data, 8, rank=r, world_size=2, seed=11) for r in range(2)]
    seen = []
    for loader in ranks:
        found = collections.Counter()
        stream = iter(loader)
        for _ in range(len(loader)):
            for row in original_tokens(next(stream)).tolist():
                found[tuple(t for t in row if t != 0)] += 1
        assert loader.epoch == 0 and loader.batch == len(loader)
        seen.append(found)
    everything = all_examples(dynamic_data)
    assert sum(seen[0].values()) == sum(seen[1].values()) == len(ranks[0]) * 8
    assert not (seen[0] & seen[1]) - (everything - collections.Counter(set(everything)))  # only true duplicates
    assert (seen[0] + seen[1]) <= everything
    assert sum(everything.values()) - sum((seen[0] + seen[1]).values()) < 2 * 8  # only the dropped tail


@pytest.mark.parametrize("where", ["mid-epoch", "next epoch", "at the epoch's end"])
def test_resume_continues_with_exactly_the_next_sample_on_each_of_two_ranks(dynamic_data, where):
    for rank in range(2):
        def make():
            return PretrainingDataLoader(dynamic_data, 32, rank=rank, world_size=2, seed=5)
        uninterrupted = make()
        consumed = {"mid-epoch": 3, "next epoch": len(uninterrupted) + 2, "at the epoch's end": len(uninterrupted)}[where]
        stream = iter(uninterrupted)
        for _ in range(consumed):
            next(stream)
        state = uninterrupted.state_dict()
        assert all(isinstance(v, (int, str)) for v in state.values())
        expected = [next(stream) for _ in range(3)]
        resumed = make()
        resumed.load_state_dict(state)
        assert resumed.epoch == state["epoch"]
        for want, got in zip(expected, iter(resumed)):
            for key in KEYS:
                assert torch.equal(want[key], got[key]), key


def micro_batches(loader, count: int) -> list[list[int]]:
    """The examples of the loader's next `count` micro-batches (advancing it)."""
    first = loader.batch
    loader.batch += count
    return [loader.example_indices(first + i) for i in range(count)]


@pytest.mark.parametrize(("world", "accumulation", "micro"), [(1, 4, 4), (4, 1, 4), (2, 2, 4), (2, 1, 8)])
def test_a_step_holds_the_same_micro_batches_on_any_shape(dynamic_data, world, accumulation, micro):
    """Global chunks: step s's micro-batch a of rank r is chunk a*W + r of the step's 16 samples, so 2 ranks x 2
    accumulation steps, 4 x 1 and 1 x 4 form the same four micro-batches of 4 (with micro 8 the same samples in
    two micro-batches of 8); the rank-strided order of earlier versions does not."""
    def step_micro_batches(world, accumulation, micro, order=GLOBAL_CHUNKS):
        ranks = [PretrainingDataLoader(dynamic_data, micro, rank=r, world_size=world, seed=5,
                                       accumulation=accumulation, order=order) for r in range(world)]
        steps = []
        for _ in range(3):
            per_rank = [micro_batches(loader, accumulation) for loader in ranks]
            steps.append(sorted(sorted(per_rank[r][a]) for a in range(accumulation) for r in range(world)))
        return steps
    reference = step_micro_batches(1, 4, 4)
    got = step_micro_batches(world, accumulation, micro)
    if micro == 4:
        assert got == reference
    else:
        assert [sorted(sum(s, [])) for s in got] == [sorted(sum(s, [])) for s in reference] and got != reference
    assert step_micro_batches(2, 2, 4, RANK_STRIDED) != reference  # the order this replaces


def test_resume_on_another_shape_continues_with_the_same_micro_batches(dynamic_data):
    two = [PretrainingDataLoader(dynamic_data, 4, rank=r, world_size=2, seed=5, accumulation=2) for r in range(2)]
    for loader in two:
        micro_batches(loader, 6)  # three steps of 16
    one = PretrainingDataLoader(dynamic_data, 4, rank=0, world_size=1, seed=5, accumulation=4)
    one.load_state_dict(two[0].state_dict())
    assert one.batch == 12
    expected = [batch for loader in two for batch in micro_batches(loader, 2)]  # the next step of both ranks
    got = micro_batches(one, 4)
    assert sorted(map(sorted, got)) == sorted(map(sorted, expected))
    with pytest.raises(DataError, match="not a whole number of steps"):
        PretrainingDataLoader(dynamic_data, 4, world_size=3, seed=5).load_state_dict(two[0].state_dict())


def test_another_micro_batch_continues_with_the_samples_of_the_next_step(dynamic_data):
    """Global chunks: 4 ranks x micro 3 (steps of 12) continued on 3 ranks x micro 4, or on 1 rank x micro 2 x 6
    accumulation steps: the next step holds the same 12 samples, cut into other micro-batches."""
    four = [PretrainingDataLoader(dynamic_data, 3, rank=r, world_size=4, seed=5) for r in range(4)]
    for loader in four:
        micro_batches(loader, 2)  # two steps
    saved = four[0].state_dict()
    expected = sorted(i for loader in four for batch in micro_batches(loader, 1) for i in batch)
    three = [PretrainingDataLoader(dynamic_data, 4, rank=r, world_size=3, seed=5) for r in range(3)]
    one = PretrainingDataLoader(dynamic_data, 2, world_size=1, seed=5, accumulation=6)
    for loader in (*three, one):
        loader.load_state_dict(saved)
    assert sorted(i for loader in three for batch in micro_batches(loader, 1) for i in batch) == expected
    assert sorted(i for batch in micro_batches(one, 6) for i in batch) == expected
    assert micro_batches(three[0], 1) != micro_batches(four[0], 1)  # other micro-batches of the same step
    with pytest.raises(DataError, match="not a whole number of steps of 16"):
        PretrainingDataLoader(dynamic_data, 4, world_size=4, seed=5).load_state_dict(saved)  # another global batch


def test_a_checkpoint_of_the_rank_strided_order_resumes_in_it(dynamic_data):
    """Loader states written before the order was recorded ({"position", "world_size"}) continue exactly."""
    def make():
        return PretrainingDataLoader(dynamic_data, 4, rank=1, world_size=2, seed=5, order=RANK_STRIDED)
    loader = make()
    micro_batches(loader, 3)
    old_state = {"epoch": 0, "position": 12, "seed": 5, "world_size": 2, "num_examples": loader.num_examples,
                 "micro_batch_size": 4}
    resumed = make()
    resumed.load_state_dict(old_state)
    assert micro_batches(resumed, 2) == micro_batches(loader, 2)
    assert loader.example_indices(0) == [loader._permutation(2 * i + 1) for i in range(4)]  # positions 1, 3, 5, 7
    with pytest.raises(DataError, match="rank-strided order with micro batch 4 cannot continue in the global-chunks"):
        PretrainingDataLoader(dynamic_data, 4, rank=1, world_size=2, seed=5).load_state_dict(old_state)


def test_epochs_reshuffle_and_dynamic_masks_change_but_repeat_for_a_seed(dynamic_data):
    loader = PretrainingDataLoader(dynamic_data, 16, seed=2)
    order0 = [i for b in range(4) for i in loader.example_indices(b)]
    loader.load_state_dict({**loader.state_dict(), "epoch": 1, "consumed": 0})
    order1 = [i for b in range(4) for i in loader.example_indices(b)]
    assert order0 != order1
    example = order0[0]
    loader.epoch = 0
    first = loader.collate([example])
    loader.epoch = 1
    second = loader.collate([example])
    assert torch.equal(original_tokens(first), original_tokens(second))
    assert not torch.equal(first["mlm_labels"], second["mlm_labels"])
    loader.epoch = 0
    assert torch.equal(loader.collate([example])["input_ids"], first["input_ids"])


def test_static_masks_are_stored_and_identical_across_epochs(static_data):
    loader = PretrainingDataLoader(static_data, 8, seed=1)
    assert loader.dynamic_masking is False
    batch0 = loader.collate([0, 1, 2])
    loader.epoch = 3
    assert torch.equal(loader.collate([0, 1, 2])["mlm_labels"], batch0["mlm_labels"])
    assert PretrainingDataLoader(static_data, 8, seed=1, dynamic_masking=True).dynamic_masking


def test_masking_rates_and_ngram_spans(dynamic_data):
    loader = PretrainingDataLoader(dynamic_data, 64, seed=9)
    tokenizer = load_tokenizer(dynamic_data)
    mask_id = tokenizer.token_to_id("[MASK]")
    stream = iter(loader)
    predicted = masked = kept = real = 0
    runs = collections.Counter()
    for _ in range(10):
        batch = next(stream)
        labels = batch["mlm_labels"] != -100
        predicted += int(labels.sum())
        masked += int((batch["input_ids"][labels] == mask_id).sum())
        kept += int((batch["input_ids"][labels] == batch["mlm_labels"][labels]).sum())
        real += int(batch["attention_mask"].sum())  # as BERT: 15% of the length with [CLS]/[SEP]
        for row in labels.tolist():
            run = 0
            for flag in row + [False]:
                if flag:
                    run += 1
                elif run:
                    runs[min(run, 4)] += 1
                    run = 0
    assert 0.14 < predicted / real < 0.16
    assert 0.77 < masked / predicted < 0.83
    assert 0.08 < kept / predicted < 0.12
    assert runs[2] > 0.15 * runs[1] and runs[3] > 0  # n-gram spans, not only single tokens


def test_loader_memory_does_not_grow_with_corpus_size(tmp_path, wiki, vocab):
    small_text, big_text = tmp_path / "small.txt", tmp_path / "big.txt"
    small_text.write_bytes(wiki.read_bytes()[: len(wiki.read_bytes()) // 4])
    big_text.write_bytes(wiki.read_bytes() * 2)
    peaks = {}
    for name, text in (("small", small_text), ("big", big_text)):
        data = _prepare(tmp_path / name, text, vocab, seq_length=32)
        tracemalloc.start()
        loader = PretrainingDataLoader(data, 16, seed=0)
        stream = iter(loader)
        for _ in range(20):
            next(stream)
        peaks[name] = (tracemalloc.get_traced_memory()[1], loader.num_examples)
        tracemalloc.stop()
    (small_peak, small_n), (big_peak, big_n) = peaks["small"], peaks["big"]
    assert big_n > 7 * small_n
    # An index or permutation array would cost >= 8 bytes per example: (big_n - small_n) * 8 bytes.
    assert big_peak - small_peak < 0.25 * (big_n - small_n) * 8, peaks


def test_feistel_permutation_is_a_bijection():
    for n in (1, 2, 7, 1000, 4097):
        perm = FeistelPermutation(n, "k")
        assert sorted(perm(i) for i in range(n)) == list(range(n))
    assert [FeistelPermutation(1000, "a")(i) for i in range(10)] != list(range(10))


# ------------------------------------------------------------------------------------ damaged folders

def test_vocabulary_that_does_not_match_the_shards_is_an_error(tmp_path, dynamic_data):
    data = tmp_path / "data"
    shutil.copytree(dynamic_data, data)
    other = train_tokenizer(["some other text entirely, with other words. and more words here."] * 50,
                            vocab_size=200, show_progress=False)
    save_tokenizer(other, data)
    with pytest.raises(DataError, match="not the tokenizer the shards .* were built with"):
        PretrainingDataLoader(data, 4)
    with pytest.raises(DataError, match="not the tokenizer"):
        load_tokenizer(data)


def test_truncated_shard_is_an_error(tmp_path, dynamic_data):
    data = tmp_path / "data"
    shutil.copytree(dynamic_data, data)
    shard = sorted((data / "train").glob("part-*.bin"))[0]
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(DataError, match="truncated"):
        PretrainingDataLoader(data, 4)
    shutil.copy(dynamic_data / "train" / shard.name, shard)
    index = shard.with_name(shard.name.replace(".bin", ".idx.npy"))
    index.write_bytes(index.read_bytes()[:-64])
    with pytest.raises(DataError, match="index .* (unreadable|has shape)|idx.npy has .* truncated"):
        PretrainingDataLoader(data, 4)


def test_unfinished_folder_and_bad_arguments_are_errors(tmp_path, dynamic_data):
    with pytest.raises(DataError, match="does not exist"):
        PretrainingDataLoader(tmp_path / "nowhere", 4)
    (tmp_path / "half").mkdir()
    with pytest.raises(DataError, match="did not finish"):
        PretrainingDataLoader(tmp_path / "half", 4)
    with pytest.raises(DataError, match="no stored masks"):
        PretrainingDataLoader(dynamic_data, 4, dynamic_masking=False)
    with pytest.raises(DataError, match="rank 2 is outside"):
        PretrainingDataLoader(dynamic_data, 4, rank=2, world_size=2)
    with pytest.raises(DataError, match="cannot fill one step"):
        PretrainingDataLoader(dynamic_data, 10**6)
    loader = PretrainingDataLoader(dynamic_data, 4, seed=1)
    with pytest.raises(DataError, match="data folder or the seed changed"):
        loader.load_state_dict({**loader.state_dict(), "seed": 2})


def _rank_process(rank: int, data: str, port: int, results) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    loader = PretrainingDataLoader(data, 16, rank=rank, world_size=2, seed=21)
    stream = iter(loader)
    seen = [i for b in range(len(loader)) for i in loader.example_indices(b)]
    for _ in range(5):
        next(stream)
    state = loader.state_dict()
    expected = next(stream)
    resumed = PretrainingDataLoader(data, 16, rank=rank, world_size=2, seed=21)
    resumed.load_state_dict(state)
    got = next(iter(resumed))
    gathered = [None, None]
    dist.all_gather_object(gathered, seen)
    if rank == 0:
        results.put((gathered, all(torch.equal(expected[k], got[k]) for k in KEYS), loader.num_examples))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.multirank
def test_two_real_ranks_read_disjoint_slices_and_resume_exactly(dynamic_data):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.Queue()
    procs = [context.Process(target=_rank_process, args=(r, str(dynamic_data), port, results)) for r in range(2)]
    for proc in procs:
        proc.start()
    (seen0, seen1), resumed_exactly, num_examples = results.get(timeout=120)
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    assert resumed_exactly
    assert not set(seen0) & set(seen1)
    assert len(set(seen0) | set(seen1)) == len(seen0) + len(seen1) > num_examples - 2 * 16
