"""Data for the entry points: translation pairs, a tokenizer, and a collate function.

Every source of data goes the same way: rows ``{"translation": {"de": ..., "en": ...}}`` read with
``datasets.load_dataset`` (the generated corpus of ``project/corpus.py`` written as JSON lines under
``workdir/data/``, a local folder of ``train*.jsonl`` / ``validation*.jsonl`` files, or a hub name), a tokenizer
(a trained byte-level BPE, or a pretrained one such as ``gpt2``), ``{"src", "tgt"}`` examples, and ``collate`` rows
``src <sep> tgt <eos> <pad> ...`` with the loss on the target only.
"""
from __future__ import annotations

import hashlib
import json
from functools import partial
from pathlib import Path
from typing import Callable

import torch

from common.files import atomic_path, atomic_write
from project.cli import ConfigError
from project.corpus import generate_pairs

EMBEDDED = "embedded"
SRC_LANG, TGT_LANG = "de", "en"
IGNORE_INDEX = -100
PAD, SEP, EOS = "<pad>", "<sep>", "<eos>"
DEFAULT_N_TRAIN, DEFAULT_N_VALID = 4000, 200


def write_embedded_corpus(out_dir: Path, n_train: int, n_valid: int, seed: int = 0) -> dict[str, str]:
    """Write the generated corpus as ``train.jsonl`` and ``validation.jsonl`` in ``out_dir``.

    Validation pairs come from a different seed than training pairs. Existing
    files with the same content are kept. Returns ``{"train": path,
    "validation": path}`` (strings, ready for ``load_dataset("json", data_files=...)``).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, n, split_seed in (("train", n_train, seed), ("validation", n_valid, seed + 1_000_003)):
        path = out_dir / f"{split}.jsonl"
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in generate_pairs(n, split_seed))
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            atomic_write(path, text)  # several ranks may write at once
        files[split] = str(path)
    return files


def _local_data_files(folder: Path) -> dict[str, list[str]]:
    files: dict[str, list[str]] = {}
    for split, prefixes in (("train", ("train",)), ("validation", ("validation", "valid", "dev", "test"))):
        for prefix in prefixes:
            found = sorted(str(p) for p in folder.iterdir()
                           if p.name.startswith(prefix) and p.suffix in (".json", ".jsonl"))
            if found:
                files[split] = found
                break
    if set(files) != {"train", "validation"}:
        raise ConfigError(f"dataset folder {folder} needs train*.jsonl and validation*.jsonl (or dev/test) files "
                          f"of rows {{\"translation\": {{\"de\": ..., \"en\": ...}}}}; found {sorted(files) or 'none'}")
    return files


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.endswith((".json", ".jsonl")) or name.count("/") > 1


def load_translation_splits(dataset: str, workdir: Path, n_train: int | None = None, n_valid: int | None = None,
                            seed: int = 0) -> dict[str, list[dict[str, str]]]:
    """Load ``{"train": [...], "validation": [...]}`` lists of ``{"de": str, "en": str}`` pairs.

    ``dataset`` is ``"embedded"`` (generated corpus, ``n_train``/``n_valid``
    default 4000/200), a local folder of JSON-lines files, or a hub dataset
    name; the last two keep the first ``n_train``/``n_valid`` rows when given
    (all rows otherwise). Every source is read with ``datasets.load_dataset``.
    A hub dataset's ``test`` split stands in for a missing ``validation``.

    Raises ConfigError for a missing folder, a hub name that cannot be
    loaded, rows without ``translation.de``/``translation.en``, or an empty split.
    """
    if dataset == EMBEDDED:
        raw = _embedded_dataset(workdir, n_train, n_valid, seed)
        return {split: _pairs(dataset, raw, split, None) for split in ("train", "validation")}
    if Path(dataset).expanduser().is_dir():
        raw = _folder_dataset(dataset, workdir)
    elif _looks_like_path(dataset):
        raise ConfigError(f"--dataset {dataset!r} not found: give 'embedded', a folder of train/validation .jsonl "
                          f"files, or a hub name like bbaaaa/iwslt14-de-en-preprocess")
    else:
        raw = _hub_dataset(dataset)
    return {split: _pairs(dataset, raw, split, limit) for split, limit in (("train", n_train), ("validation", n_valid))}


def _embedded_dataset(workdir: Path, n_train: int | None, n_valid: int | None, seed: int):
    """The generated corpus (``n_train``/``n_valid`` pairs, default 4000/200), written once under ``workdir``."""
    import datasets

    n_train = DEFAULT_N_TRAIN if n_train is None else n_train
    n_valid = DEFAULT_N_VALID if n_valid is None else n_valid
    folder = Path(workdir) / "data" / f"embedded-seed{seed}-n{n_train}-v{n_valid}"
    return datasets.load_dataset("json", data_files=write_embedded_corpus(folder, n_train, n_valid, seed),
                                 cache_dir=str(Path(workdir) / "hf_datasets"))


def _folder_dataset(dataset: str, workdir: Path):
    """A local folder of JSON-lines files; ConfigError when they cannot be read as one dataset."""
    import datasets

    try:
        return datasets.load_dataset("json", data_files=_local_data_files(Path(dataset).expanduser()),
                                     cache_dir=str(Path(workdir) / "hf_datasets"))
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - unreadable or inconsistent files
        cause = exc.__cause__ or exc
        raise ConfigError(f"--dataset: could not read dataset folder {dataset!r}: {type(cause).__name__}: {cause}. "
                          f"Rows must be {{\"translation\": {{\"de\": ..., \"en\": ...}}}}") from None


def _hub_dataset(dataset: str):
    """A hub dataset, its ``test`` split standing in for a missing ``validation``; ConfigError when it cannot be
    loaded."""
    import datasets

    try:
        raw = datasets.load_dataset(dataset)
    except Exception as exc:  # noqa: BLE001 - any failure here means "cannot use this dataset"
        raise ConfigError(f"--dataset: could not load dataset {dataset!r} ({type(exc).__name__}: {exc}). "
                          f"Without network, use the default --dataset embedded or a local folder of .jsonl "
                          f"files") from None
    if "validation" not in raw and "test" in raw:
        raw["validation"] = raw["test"]
    return raw


def _pairs(dataset: str, raw, split: str, limit: int | None) -> list[dict[str, str]]:
    """The first ``limit`` (all when None) ``{"de", "en"}`` pairs of ``raw[split]``; ConfigError for a missing
    split, no ``translation`` column, a malformed row or no row at all."""
    if split not in raw:
        raise ConfigError(f"dataset {dataset!r} has no {split!r} split (it has {sorted(raw)})")
    rows = raw[split]
    if limit is not None:
        rows = rows.select(range(min(limit, len(rows))))
    if "translation" not in rows.column_names:
        raise ConfigError(f"dataset {dataset!r} split {split!r} has no 'translation' column "
                          f"(columns: {rows.column_names})")
    pairs = []
    for pair in rows["translation"]:
        if not isinstance(pair, dict) or SRC_LANG not in pair or TGT_LANG not in pair:
            raise ConfigError(f"dataset {dataset!r}: a {split} row is not {{'de': ..., 'en': ...}}: {pair!r}")
        pairs.append({SRC_LANG: pair[SRC_LANG], TGT_LANG: pair[TGT_LANG]})
    if not pairs:
        raise ConfigError(f"dataset {dataset!r} split {split!r} is empty")
    return pairs


def _train_bpe(texts: list[str], vocab_size: int):
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer(add_prefix_space=False)
    tok.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=[PAD, SEP, EOS],
                            show_progress=False)
    return tok


def load_tokenizer(name: str, train_texts: list[str], workdir: Path, vocab_size: int = 2000):
    """Return a ``transformers`` fast tokenizer with ``pad``, ``sep`` and ``eos`` tokens.

    ``name == "bpe"``: a byte-level BPE trained on ``train_texts`` (in sorted
    order, so it does not depend on their order), cached under
    ``workdir/tokenizers/``. Any other name is loaded with
    ``AutoTokenizer.from_pretrained`` (``"gpt2"`` needs network or the hub
    cache) and gets ``<pad>``/``<sep>`` added when it lacks them; the model's
    embedding must then be sized with ``len(tokenizer)``.
    Raises ConfigError when a pretrained tokenizer cannot be loaded.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if name == "bpe":
        digest = hashlib.sha256("\n".join(sorted(train_texts)).encode()).hexdigest()[:16]
        folder = Path(workdir) / "tokenizers" / f"bpe{vocab_size}-{digest}"
        if not (folder / "tokenizer.json").exists():
            tok = PreTrainedTokenizerFast(tokenizer_object=_train_bpe(sorted(train_texts), vocab_size)._tokenizer,
                                          pad_token=PAD, sep_token=SEP, eos_token=EOS)
            folder.parent.mkdir(parents=True, exist_ok=True)
            try:
                with atomic_path(folder) as scratch:
                    tok.save_pretrained(scratch)
            except OSError:
                if not (folder / "tokenizer.json").exists():   # else another rank won the race, which is fine
                    raise
        return PreTrainedTokenizerFast.from_pretrained(folder)
    try:
        tok = AutoTokenizer.from_pretrained(name)
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"--tokenizer: could not load tokenizer {name!r} ({type(exc).__name__}: {exc}); "
                          f"the default --tokenizer bpe needs no network") from None
    extra = {}
    if tok.pad_token is None:
        extra["pad_token"] = PAD
    if tok.sep_token is None:
        extra["sep_token"] = SEP
    if tok.eos_token is None:
        extra["eos_token"] = EOS
    if extra:
        tok.add_special_tokens(extra)
    return tok


def tokenize_pairs(pairs: list[dict[str, str]], tokenizer) -> list[dict[str, list[int]]]:
    """Turn ``{"de", "en"}`` pairs into ``{"src": ids, "tgt": ids}`` examples (no special tokens)."""
    src = tokenizer([p[SRC_LANG] for p in pairs], add_special_tokens=False)["input_ids"]
    tgt = tokenizer([p[TGT_LANG] for p in pairs], add_special_tokens=False)["input_ids"]
    return [{"src": s, "tgt": t} for s, t in zip(src, tgt)]


def make_collate(tokenizer, max_len: int) -> Callable[[list[dict]], dict[str, torch.Tensor]]:
    """Return ``collate(examples) -> {"input_ids", "labels", "attention_mask"}`` (LongTensors ``[B, T]``).

    Each row is ``src <sep> tgt <eos>`` right-padded with ``<pad>`` to the
    longest row (at most ``max_len``); ``labels`` equals ``input_ids`` on
    ``tgt`` and ``<eos>`` and is -100 elsewhere (source, separator, padding).
    Too-long rows lose the end of the source first, then of the target; the
    separator and ``<eos>`` always stay. ``attention_mask`` is 1 on real tokens.
    The function pickles (ranks receive it). Raises ValueError when ``max_len < 4``.
    """
    if max_len < 4:
        raise ValueError(f"max_len must be >= 4, got {max_len}")
    return partial(_collate, tokenizer.pad_token_id, tokenizer.sep_token_id, tokenizer.eos_token_id, max_len)


def _collate(pad_id: int, sep_id: int, eos_id: int, max_len: int, examples: list[dict]) -> dict[str, torch.Tensor]:
    rows, labels = [], []
    for ex in examples:
        src, tgt = list(ex["src"]), list(ex["tgt"])
        budget = max_len - 2
        tgt = tgt[:max(budget // 2, budget - len(src))]
        src = src[:budget - len(tgt)]
        rows.append(src + [sep_id] + tgt + [eos_id])
        labels.append([IGNORE_INDEX] * (len(src) + 1) + tgt + [eos_id])
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    label_t = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, lab) in enumerate(zip(rows, labels)):
        input_ids[i, :len(r)] = torch.tensor(r)
        label_t[i, :len(lab)] = torch.tensor(lab)
        mask[i, :len(r)] = 1
    return {"input_ids": input_ids, "labels": label_t, "attention_mask": mask}


def prepare_data(dataset: str, tokenizer_name: str, workdir: Path, n_train: int | None = None,
                 n_valid: int | None = None, seed: int = 0):
    """Load the splits and the tokenizer, and tokenize both splits.

    Returns ``(train_examples, valid_examples, tokenizer)``; see
    ``load_translation_splits`` and ``load_tokenizer`` for errors.
    """
    splits = load_translation_splits(dataset, workdir, n_train, n_valid, seed)
    texts = [p[SRC_LANG] for p in splits["train"]] + [p[TGT_LANG] for p in splits["train"]]
    tokenizer = load_tokenizer(tokenizer_name, texts, workdir)
    return tokenize_pairs(splits["train"], tokenizer), tokenize_pairs(splits["validation"], tokenizer), tokenizer
