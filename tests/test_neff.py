"""The NEFF container: round trip, zero-copy alignment, and clear errors for bad files."""

from __future__ import annotations

import struct

import pytest

from torch_neuronx.format import neff

PAYLOAD = bytes(range(256)) * 40


def make(**kw) -> bytes:
    args = {"target": "cpu", "compiler_version": "iree-compile 3.13.0", "key": "ab" * 32, **kw}
    return neff.encode(PAYLOAD, **args)


def test_round_trip_keeps_header_and_payload(tmp_path):
    path = tmp_path / "module.neff"
    path.write_bytes(make(signature={"inputs": [{"shape": [2], "dtype": "float32"}]}))
    loaded = neff.load(path)
    assert bytes(loaded.payload) == PAYLOAD
    assert loaded.header.target == "cpu"
    assert loaded.header.compiler_version == "iree-compile 3.13.0"
    assert loaded.header.key == "ab" * 32
    assert loaded.header.format_version == neff.FORMAT_VERSION
    assert loaded.header.signature["inputs"][0]["shape"] == [2]


def test_payload_starts_on_a_page_boundary():
    data = make()
    assert data.index(PAYLOAD) % neff.PAYLOAD_ALIGNMENT == 0


def test_wrong_magic_is_rejected(tmp_path):
    path = tmp_path / "bad.neff"
    path.write_bytes(b"NOTANEFF" + make()[8:])
    with pytest.raises(neff.NeffFormatError, match="wrong magic.*not a torch_neuronx NEFF"):
        neff.load(path)


def test_other_format_version_is_rejected():
    data = bytearray(make())
    struct.pack_into("<I", data, 8, neff.FORMAT_VERSION + 1)
    with pytest.raises(neff.NeffFormatError, match=f"format version {neff.FORMAT_VERSION + 1}"):
        neff.decode(bytes(data))


def test_flipped_payload_byte_fails_the_checksum():
    data = bytearray(make())
    data[-100] ^= 0xFF
    with pytest.raises(neff.NeffFormatError, match="checksum"):
        neff.decode(bytes(data))


def test_an_edited_header_fails_its_checksum_even_when_it_still_parses(tmp_path):
    """A flipped byte in the header that keeps it valid JSON (a shape 2 read as 3, another key)
    was believed: the runtime would have read the outputs with the wrong shape."""
    data = make(signature={"inputs": [{"shape": [2], "dtype": "float32"}]})
    edited = data.replace(b'"shape": [2]', b'"shape": [3]', 1)
    assert edited != data and len(edited) == len(data)
    path = tmp_path / "edited.neff"
    path.write_bytes(edited)
    for read in (neff.load, neff.read_header):
        with pytest.raises(neff.NeffFormatError, match="header fails its checksum"):
            read(path)


def test_a_header_without_its_checksum_is_corrupt():
    data = bytearray(make())
    at = data.index(b'"header_sha256"')
    data[at:at + 15] = b'"header_sha999"'
    with pytest.raises(neff.NeffFormatError, match="corrupt header"):
        neff.decode(bytes(data))


@pytest.mark.parametrize("cut", [4, 40, 5000])
def test_truncated_file_is_rejected(tmp_path, cut):
    path = tmp_path / "short.neff"
    path.write_bytes(make()[:-cut] if cut == 5000 else make()[:cut])
    with pytest.raises(neff.NeffFormatError, match="truncated"):
        neff.load(path)


def test_empty_file_is_rejected(tmp_path):
    path = tmp_path / "empty.neff"
    path.write_bytes(b"")
    with pytest.raises(neff.NeffFormatError, match="empty"):
        neff.load(path)


def test_a_loaded_neff_does_not_change_when_its_file_is_rewritten(tmp_path):
    """A file rewritten in place after loading (``cp`` onto a shared cache, a truncation) gave the
    loaded, mapped NEFF the new bytes (another model's results, or SIGBUS): loading reads it, into
    page-aligned memory (IREE takes the payload in place)."""
    import ctypes
    import os
    import subprocess
    import sys

    path = tmp_path / "module.neff"
    path.write_bytes(make())
    loaded = neff.load(path)
    with open(path, "r+b") as f:  # same inode, new bytes
        f.seek(len(make()) - len(PAYLOAD))
        f.write(bytes(len(PAYLOAD)))
    assert bytes(loaded.payload) == PAYLOAD
    address = ctypes.addressof(ctypes.c_char.from_buffer(loaded.payload))
    assert address % neff.PAYLOAD_ALIGNMENT == 0
    path.write_bytes(make())
    code = ("import os, sys\nfrom torch_neuronx.format import neff\n"
            "loaded = neff.load(sys.argv[1])\nos.truncate(sys.argv[1], 64)\n"
            "print(sum(bytes(loaded.payload)))\n")
    run = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ))
    assert run.returncode == 0, run.stderr[-2000:]  # SIGBUS: -7
    assert int(run.stdout) == sum(PAYLOAD)
