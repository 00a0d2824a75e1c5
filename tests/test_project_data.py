"""The entry points' data: generated corpus, loading (embedded, local IWSLT layout), tokenizer, collate."""
from __future__ import annotations

import json
import random

import pytest

from project.cli import ConfigError
from project.corpus import generate_pairs
from project.data import (IGNORE_INDEX, load_tokenizer, load_translation_splits, make_collate,
                          prepare_data, tokenize_pairs)

pytestmark = pytest.mark.project


def test_corpus_is_deterministic_and_leaves_global_random_alone():
    state = random.getstate()
    first, again, other = generate_pairs(50, seed=3), generate_pairs(50, seed=3), generate_pairs(50, seed=4)
    assert random.getstate() == state
    assert first == again
    assert first != other
    assert all(set(row["translation"]) == {"de", "en"} for row in first)
    assert len({row["translation"]["de"] for row in generate_pairs(500, seed=0)}) > 450   # varied, not templated


def test_corpus_follows_its_grammar():
    pairs = [row["translation"] for row in generate_pairs(3000, seed=1)]
    # German verb-final perfect -> English "has/have <participle>"; "gestern" -> simple past without "has"
    perfect = [p for p in pairs if p["de"].endswith(" gesehen .") and not p["de"].startswith("Gestern")]
    assert perfect and all(" seen " in p["en"] and (" has " in p["en"] or " have " in p["en"]) for p in perfect)
    yesterday = [p for p in pairs if p["de"].startswith("Gestern")]
    assert yesterday and all(p["en"].startswith("Yesterday") and " has " not in p["en"] for p in yesterday)
    # agreement: masculine accusative singular article "den Hund" <-> "the dog" object
    assert any(" den Hund " in p["de"] + " " and "the dog" in p["en"] for p in pairs)
    assert any(p["en"].startswith("Does ") and p["de"].endswith(" ?") for p in pairs)


def test_iwslt_layout_from_a_local_folder(tmp_path):
    """Rows shaped like bbaaaa/iwslt14-de-en-preprocess go through the same loading code as the hub."""
    folder = tmp_path / "iwslt"
    folder.mkdir()
    rows = [{"translation": {"de": f"Satz Nummer {i} .", "en": f"sentence number {i} ."}} for i in range(30)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:20]))
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[20:]))
    splits = load_translation_splits(str(folder), tmp_path / "work", n_train=12)
    assert splits["train"] == [r["translation"] for r in rows[:12]]
    assert splits["validation"] == [r["translation"] for r in rows[20:]]   # test stands in for validation

    for split in ("train", "test"):
        (folder / f"{split}.jsonl").write_text(json.dumps({"text": "no translation here"}) + "\n")
    with pytest.raises(ConfigError, match="translation"):
        load_translation_splits(str(folder), tmp_path / "work")
    (folder / "train.jsonl").write_text("{not json\n")
    with pytest.raises(ConfigError, match="could not read dataset folder"):
        load_translation_splits(str(folder), tmp_path / "work")


def test_missing_dataset_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_translation_splits(str(tmp_path / "nowhere"), tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="train"):
        load_translation_splits(str(empty), tmp_path)


def test_tokenizer_cache_and_collate(tmp_path):
    train, valid, tok = prepare_data("embedded", "bpe", tmp_path, n_train=200, n_valid=20, seed=0)
    assert len(train) == 200 and len(valid) == 20
    cached = list((tmp_path / "tokenizers").iterdir())
    assert len(cached) == 1
    texts = [p for row in generate_pairs(200, 0) for p in row["translation"].values()]
    again = load_tokenizer("bpe", list(reversed(texts)), tmp_path)   # order does not matter: same cache entry
    assert list((tmp_path / "tokenizers").iterdir()) == cached
    assert again("Der Hund sieht die Katze .")["input_ids"] == tok("Der Hund sieht die Katze .")["input_ids"]

    pair = {"de": "Der Hund sieht die Katze .", "en": "The dog sees the cat ."}
    ex = tokenize_pairs([pair], tok)[0]
    assert tok.decode(ex["src"]) == pair["de"] and tok.decode(ex["tgt"]) == pair["en"]
    short = {"src": ex["src"][:2], "tgt": ex["tgt"][:1]}
    batch = make_collate(tok, max_len=64)([ex, short])
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    n_src, n_tgt = len(ex["src"]), len(ex["tgt"])
    assert ids.shape == labels.shape == mask.shape == (2, n_src + n_tgt + 2)
    assert ids[0, n_src] == tok.sep_token_id and ids[0, -1] == tok.eos_token_id
    assert (labels[0, :n_src + 1] == IGNORE_INDEX).all()
    assert labels[0, n_src + 1:].tolist() == ex["tgt"] + [tok.eos_token_id]
    assert mask[1].tolist() == [1] * 5 + [0] * (n_src + n_tgt - 3)
    assert (ids[1, 5:] == tok.pad_token_id).all() and (labels[1, 5:] == IGNORE_INDEX).all()
    assert labels[1].tolist()[:5] == [IGNORE_INDEX] * 3 + [short["tgt"][0], tok.eos_token_id]

    cut = make_collate(tok, max_len=8)([{"src": list(range(10, 30)), "tgt": list(range(40, 60))}])
    assert cut["input_ids"].shape == (1, 8)
    assert cut["input_ids"][0].tolist() == [10, 11, 12, tok.sep_token_id, 40, 41, 42, tok.eos_token_id]


def test_pretrained_tokenizer_and_model_paths_from_local_folders(tmp_path):
    """--tokenizer NAME / --pretrained NAME (hub names in real use) through local folders, no network."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    from project.model import build_model

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["Der Hund sieht die Katze .", "The dog sees the cat ."] * 5, vocab_size=300,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    plain = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>")  # like gpt2
    plain.save_pretrained(tmp_path / "tok")
    tok = load_tokenizer(str(tmp_path / "tok"), [], tmp_path)
    assert tok.pad_token_id is not None and tok.sep_token_id is not None and tok.eos_token_id is not None
    assert len({tok.pad_token_id, tok.sep_token_id, tok.eos_token_id}) == 3 and len(tok) == len(plain) + 2

    GPT2LMHeadModel(GPT2Config(vocab_size=len(plain), n_layer=1, n_head=2, n_embd=16,
                               n_positions=32)).save_pretrained(tmp_path / "model")
    model = build_model("tiny", tok, pretrained=str(tmp_path / "model"))
    assert model.config.n_layer == 1 and model.get_input_embeddings().num_embeddings == len(tok)
    with pytest.raises(ConfigError, match="could not load pretrained model"):
        build_model("tiny", tok, pretrained=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="unknown preset"):
        build_model("huge", tok)
