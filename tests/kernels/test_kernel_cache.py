"""The cubin disk cache: a key that covers what changes the cubin, verified entries, trusted directories.

All on a CPU (NVRTC needs no driver). Tests internals (listed in tests/README.md):
``_kernels.cubin_cache._nvrtc_library`` (the NVRTC build's identity, replaced to stand for another build).
"""

import os
import stat
import warnings

import pytest

import jaxgraph
from jaxgraph._kernels.compile import nvrtc_version
from jaxgraph._kernels.cubin import is_cubin
from support.kernel_sources import ADD_ONE

SCALE = r"""
#include "act.cuh"
extern "C" __global__ void scale(float* y, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = ACT(x[i]);
}
"""


def compile_scale(cache, include, source=SCALE):
    return jaxgraph.Kernel(source, "scale", {"include_path": [str(include)]}, arch="sm_90", cache_dir=cache)


def cache_warnings(record):
    return [str(w.message) for w in record if issubclass(w.category, RuntimeWarning) and "cache" in str(w.message)]


# ---------------------------------------------------------------------------
# The key covers what changes the cubin
# ---------------------------------------------------------------------------


def test_an_edited_header_is_compiled_again(tmp_path):
    include = tmp_path / "include"
    include.mkdir()
    (include / "act.cuh").write_text('#include "inner.cuh"\n#define ACT(v) ((v) * FACTOR)\n')
    (include / "inner.cuh").write_text("#define FACTOR 2.0f\n")
    cache = tmp_path / "cache"
    first = compile_scale(cache, include)
    assert not first.cache_hit and compile_scale(cache, include).cache_hit   # unchanged headers: a hit

    (include / "act.cuh").write_text('#include "inner.cuh"\n#define ACT(v) ((v) * FACTOR + 1.0f)\n')
    edited = compile_scale(cache, include)
    assert not edited.cache_hit and edited.cubin != first.cubin

    (include / "inner.cuh").write_text("#define FACTOR 3.0f\n")           # a header the header includes
    nested = compile_scale(cache, include)
    assert not nested.cache_hit and nested.cubin not in (first.cubin, edited.cubin)
    assert compile_scale(cache, include).cache_hit


def test_a_header_found_through_angle_brackets_is_in_the_key(tmp_path):
    include = tmp_path / "include"
    include.mkdir()
    (include / "act.cuh").write_text("#define ACT(v) ((v) * 2.0f)\n")
    source = SCALE.replace('"act.cuh"', "<act.cuh>")
    first = compile_scale(tmp_path / "cache", include, source)
    (include / "act.cuh").write_text("#define ACT(v) ((v) * 5.0f)\n")
    again = compile_scale(tmp_path / "cache", include, source)
    assert not again.cache_hit and again.cubin != first.cubin


def test_a_header_that_appears_earlier_on_the_include_path_is_in_the_key(tmp_path):
    early, late = tmp_path / "early", tmp_path / "late"
    early.mkdir()
    late.mkdir()
    (late / "act.cuh").write_text("#define ACT(v) ((v) * 2.0f)\n")
    options = {"include_path": [str(early), str(late)]}
    first = jaxgraph.Kernel(SCALE, "scale", options, arch="sm_90", cache_dir=tmp_path / "cache")
    (early / "act.cuh").write_text("#define ACT(v) ((v) * 7.0f)\n")        # now shadows late/act.cuh
    again = jaxgraph.Kernel(SCALE, "scale", options, arch="sm_90", cache_dir=tmp_path / "cache")
    assert not again.cache_hit and again.cubin != first.cubin


def test_the_cuda_headers_version_is_in_the_key(tmp_path):
    headers = tmp_path / "cuda_include"
    headers.mkdir()
    options = {"include_path": [str(headers)]}
    (headers / "cuda.h").write_text("#define CUDA_VERSION 13000\n")       # the source does not include it
    first = jaxgraph.Kernel(ADD_ONE, "add_one", options, arch="sm_90", cache_dir=tmp_path / "cache")
    (headers / "cuda.h").write_text("#define CUDA_VERSION 13010\n")
    again = jaxgraph.Kernel(ADD_ONE, "add_one", options, arch="sm_90", cache_dir=tmp_path / "cache")
    assert not first.cache_hit and not again.cache_hit


def test_another_nvrtc_build_is_another_entry(tmp_path, monkeypatch):
    from jaxgraph._kernels import cubin_cache

    first = jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path)
    assert jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path).cache_hit
    identity = cubin_cache._nvrtc_library()
    assert identity["version"] == list(nvrtc_version())
    assert identity["files"] and all(size > 0 for _, size, _ in identity["files"])   # the library's own file
    other = {**identity, "files": [[name, size + 1, mtime] for name, size, mtime in identity["files"]]}
    monkeypatch.setattr(cubin_cache, "_nvrtc_library", lambda: other)          # same major.minor, other build
    again = jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path)
    assert not again.cache_hit and again.cubin == first.cubin


# ---------------------------------------------------------------------------
# Entries are verified
# ---------------------------------------------------------------------------


def test_an_altered_cubin_is_compiled_again_with_one_warning(tmp_path):
    first = jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path)
    altered = bytearray(first.cubin)
    altered[len(altered) // 2] ^= 0xFF                                   # same ELF header, other code
    first.cache_path.write_bytes(bytes(altered))
    assert is_cubin(bytes(altered))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        again = jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path)
        assert not again.cache_hit and again.cubin == first.cubin
        assert again.cache_path.read_bytes() == first.cubin           # the entry is repaired
        first.cache_path.write_bytes(bytes(altered))                  # altered again: compiled again, no new warning
        assert not jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path).cache_hit
    (message,) = cache_warnings(record)
    assert str(first.cache_path) in message and "digest" in message
    assert jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path).cache_hit


@pytest.mark.parametrize("meta", ["[1, 2]", '"add_one"', "3", "null", '{"lowered_name": 5}',
                                  '{"lowered_name": "add_one"}', '{"lowered_name": "add_one", "sha256": 7}'])
def test_valid_json_of_the_wrong_shape_is_compiled_again(tmp_path, meta):
    first = jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path)
    first.cache_path.with_suffix(".json").write_text(meta)
    again = jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path)
    assert not again.cache_hit and again.cubin == first.cubin and again.lowered_name == "add_one"
    assert jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path).cache_hit


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.warns(RuntimeWarning, match="cannot write its kernel cache"):
        k = jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path)
    assert is_cubin(k.cubin) and k.cache_path is None
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------
# Only a directory no one else can write is used
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode, why", [(0o777, "writable by every user"), (0o775, "writable by its group"),
                                       (0o1777, "writable by every user")])
def test_a_directory_others_can_write_is_not_used(tmp_path, mode, why):
    shared = tmp_path / "shared"
    first = jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=shared)   # an entry someone could plant
    entries = sorted(shared.iterdir())
    shared.chmod(mode)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        k = jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=shared)
        other = jaxgraph.Kernel(ADD_ONE + "\n// v2\n", "add_one", arch="sm_90", cache_dir=shared)
    assert not k.cache_hit and k.cache_path is None and k.cubin == first.cubin
    assert not other.cache_hit and sorted(shared.iterdir()) == entries        # nothing written there either
    (message,) = cache_warnings(record)                                          # once per directory
    assert str(shared) in message and why in message and oct(mode)[2:] in message


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="needs root to give a directory to another user")
def test_a_directory_owned_by_another_user_is_not_used(tmp_path):
    theirs = tmp_path / "theirs"
    jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=theirs)
    os.chown(theirs, 4321, 4321)
    with pytest.warns(RuntimeWarning, match=r"owned by user id 4321") as record:
        k = jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=theirs)
    assert not k.cache_hit and k.cache_path is None
    assert str(theirs) in str(record[0].message)


def test_directories_jaxgraph_creates_are_private(tmp_path):
    old = os.umask(0o002)                          # a umask that would leave them group-writable
    try:
        k = jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path / "a" / "b")
    finally:
        os.umask(old)
    for directory in (tmp_path / "a", tmp_path / "a" / "b"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    files = sorted((tmp_path / "a" / "b").iterdir())
    assert [f.suffix for f in files] == [".cubin", ".json"] and k.cache_path in files
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert jaxgraph.Kernel(ADD_ONE, "add_one", arch="sm_90", cache_dir=tmp_path / "a" / "b").cache_hit
