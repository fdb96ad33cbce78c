"""Hostile kept-run archives (issue 47, item 5): a compression bomb, an archive of many members or one whose header
asks for a huge read is refused in one line naming the archive, the bound and the fix, having unpacked at most the
bound and written nothing."""
import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest

from fedsim.errors import ConfigError
from fedsim.reproduce import archive

SMALL = {"config.yaml": b"name: r\n", "summary.json": b'{"rounds": 2}', "rounds.jsonl": b'{"round": 1}\n'}


def _header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info.tobuf(format=tarfile.GNU_FORMAT)


def _padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % tarfile.BLOCKSIZE)


def _bomb(path: Path, zeros: int) -> None:
    """metrics.jsonl of ``zeros`` zero bytes first, then the other kept files: streamed through gzip in chunks, so
    the test never holds or writes the unpacked size."""
    with gzip.open(path, "wb", compresslevel=9) as gz:
        gz.write(_header("metrics.jsonl", zeros))
        chunk = b"\0" * (1 << 20)
        for _ in range(zeros // len(chunk)):
            gz.write(chunk)
        for name, data in SMALL.items():
            gz.write(_header(name, len(data)) + _padded(data))
        gz.write(b"\0" * tarfile.RECORDSIZE)


def _refused(tmp_path: Path) -> tuple[str, Path]:
    runs = tmp_path / "runs"
    runs.mkdir()
    with pytest.raises(ConfigError) as err:
        archive.restore(tmp_path / "kept", runs, "run-s0")
    assert list(runs.iterdir()) == []  # nothing extracted, not even beside the runs folder
    return str(err.value), runs


def test_a_compression_bomb_is_refused_before_its_data_is_unpacked(tmp_path):
    (tmp_path / "kept").mkdir()
    source = tmp_path / "kept" / "run-s0.tar.gz"
    _bomb(source, 64 << 20)  # 64 MiB of zeros in ~64 KiB: a ratio of about 1000
    assert os.path.getsize(source) * archive.MAX_RATIO < 64 << 20
    text, _ = _refused(tmp_path)
    assert "\n" not in text and text.startswith(f"{source}: unpacks to more than ")
    assert f"{archive.MAX_RATIO} times the archive's size" in text and f"remove {source}" in text


def test_the_total_bound_holds_for_an_archive_that_does_not_compress(tmp_path, monkeypatch):
    monkeypatch.setattr(archive, "MAX_BYTES", 4096)
    (tmp_path / "kept").mkdir()
    source = tmp_path / "kept" / "run-s0.tar.gz"
    with tarfile.open(source, "w:gz") as tar:
        for name, data in {**SMALL, "metrics.jsonl": os.urandom(8192)}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    text, _ = _refused(tmp_path)
    assert "unpacks to more than 4,096 bytes (the bound: 4,096 bytes" in text


def test_a_header_asking_for_a_huge_read_stops_at_the_bound(tmp_path, monkeypatch):
    """A GNU long-name header declaring 2 GiB: tarfile reads such a name whole, so the stream itself refuses."""
    (tmp_path / "kept").mkdir()
    source = tmp_path / "kept" / "run-s0.tar.gz"
    source.write_bytes(gzip.compress(_header("././@LongLink", 2 << 30, tarfile.GNUTYPE_LONGNAME) + b"x" * 4096))
    text, _ = _refused(tmp_path)
    assert "unpacks to more than" in text


def test_an_archive_of_many_members_is_refused_at_its_first_headers(tmp_path, monkeypatch):
    (tmp_path / "kept").mkdir()
    source = tmp_path / "kept" / "run-s0.tar.gz"
    member = _header("config.yaml", len(SMALL["config.yaml"])) + _padded(SMALL["config.yaml"])
    source.write_bytes(gzip.compress(member * 20_000 + b"\0" * tarfile.RECORDSIZE))
    headers_read = []
    real = tarfile.TarInfo.fromtarfile.__func__

    def counted(cls, tar):
        headers_read.append(1)
        return real(cls, tar)

    monkeypatch.setattr(tarfile.TarInfo, "fromtarfile", classmethod(counted))
    text, _ = _refused(tmp_path)
    assert "holds a file twice" in text and len(headers_read) <= archive.MAX_MEMBERS + 1
